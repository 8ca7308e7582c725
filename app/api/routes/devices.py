"""``/v1/devices``: the device profiles (MISSION section 5, from the sourced data file) and
those an admin added."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from app.api.deps import AdminDep, SessionDep
from app.device_schemas import DeviceCreate, DevicePublic, DevicesPublic
from service.devices import all_devices, find_device, profile_of
from service.models import Device

router = APIRouter(prefix="/devices", tags=["devices"])


@router.get("", response_model=DevicesPublic)
def list_devices(session: SessionDep) -> DevicesPublic:
    devices = [DevicePublic(**d.to_json()) for d in all_devices(session).values()]
    return DevicesPublic(data=devices, count=len(devices))


@router.get("/{device_id}", response_model=DevicePublic)
def get_device(device_id: str, session: SessionDep) -> DevicePublic:
    device = find_device(session, device_id)
    if device is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no device profile {device_id!r}")
    return DevicePublic(**device.to_json())


@router.post("", response_model=DevicePublic, status_code=status.HTTP_201_CREATED)
def add_device(body: DeviceCreate, session: SessionDep, _: AdminDep) -> DevicePublic:
    """Admins only: a profile every tenant can then run jobs and fleets on."""
    if session.get(Device, body.id) is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"device profile {body.id!r} exists")
    row = Device(**body.model_dump(), builtin=False)
    session.add(row)
    session.commit()
    return DevicePublic(**profile_of(row).to_json())
