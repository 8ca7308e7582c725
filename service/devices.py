"""Device profiles as the service knows them: the sourced built-in ones of devices.json,
synced into the devices table at start, plus those an admin adds."""

from __future__ import annotations

from sqlmodel import Session, select

from mebp_core.plan.devices import DeviceProfile, load_devices, make_profile
from service.models import Device


def sync_builtin_devices(session: Session) -> None:
    """Write the profiles of devices.json into the devices table (jobs refer to them)."""
    for profile in load_devices().values():
        row = session.get(Device, profile.id) or Device(id=profile.id, name=profile.name)
        row.name, row.ram_mb, row.budget_mb = profile.name, profile.ram_mb, profile.budget_mb
        row.chip, row.relative_compute = profile.chip, profile.relative_compute
        row.sources, row.builtin = list(profile.sources), True
        session.add(row)
    session.commit()


def profile_of(row: Device) -> DeviceProfile:
    builtin = load_devices()
    if row.builtin and row.id in builtin:  # its rates and sources are the data file's
        return builtin[row.id]
    return make_profile({"id": row.id, "name": row.name, "ram_mb": row.ram_mb,
                         "budget_mb": row.budget_mb, "chip": row.chip,
                         "relative_compute": row.relative_compute, "sources": row.sources})


def all_devices(session: Session) -> dict[str, DeviceProfile]:
    """Built-in profiles first, in the data file's order, then the added ones by id."""
    builtin = list(load_devices())
    rows = sorted(session.exec(select(Device)).all(),
                  key=lambda row: (builtin.index(row.id) if row.id in builtin else len(builtin),
                                   row.id))
    return {row.id: profile_of(row) for row in rows}


def find_device(session: Session, device_id: str) -> DeviceProfile | None:
    row = session.get(Device, device_id)
    return None if row is None else profile_of(row)
