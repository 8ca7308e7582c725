"""Device profiles (MISSION section 5), read from the sourced data file."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from app.schemas import DevicePublic, DevicesPublic
from mebp_core.plan.devices import load_devices

router = APIRouter(prefix="/devices", tags=["devices"])


@router.get("", response_model=DevicesPublic)
def list_devices() -> DevicesPublic:
    devices = [DevicePublic(**d.to_json()) for d in load_devices().values()]
    return DevicesPublic(data=devices, count=len(devices))


@router.get("/{device_id}", response_model=DevicePublic)
def get_device(device_id: str) -> DevicePublic:
    device = load_devices().get(device_id)
    if device is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no device profile {device_id!r}")
    return DevicePublic(**device.to_json())
