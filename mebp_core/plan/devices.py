"""Device profiles (MISSION section 5) from ``devices.json``, which cites its sources.

On-device step time is an estimate: the step's matmul FLOPs over the device's effective
throughput, which is the reference phone's (calibrated from a published per-step time) scaled
by the device's ``relative_compute``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from mebp_core.plan.arch import PlanInputError
from mebp_core.units import MB

DEVICES_FILE = Path(__file__).with_name("devices.json")


@dataclass(frozen=True)
class DeviceProfile:
    id: str
    name: str
    ram_mb: int | None
    budget_mb: int | None
    chip: str | None
    relative_compute: float | None
    sources: tuple[str, ...]
    effective_flops: float | None = None  # FLOP/s, derived from the reference

    @property
    def budget_bytes(self) -> int | None:
        return None if self.budget_mb is None else self.budget_mb * MB

    def estimate_step_time(self, prediction) -> float | None:
        if self.effective_flops is None:
            return None
        return prediction.flops / self.effective_flops

    def to_json(self) -> dict:
        return {"id": self.id, "name": self.name, "ram_mb": self.ram_mb,
                "budget_mb": self.budget_mb, "chip": self.chip,
                "relative_compute_estimate": self.relative_compute,
                "effective_gflops_estimate": None if self.effective_flops is None
                else round(self.effective_flops / 1e9, 1),
                "sources": list(self.sources)}


@cache
def load_devices() -> dict[str, DeviceProfile]:
    return {raw["id"]: make_profile(raw) for raw in
            json.loads(DEVICES_FILE.read_text())["devices"]}


def make_profile(raw: dict) -> DeviceProfile:
    """A profile from its fields (as in devices.json), its throughput from the reference."""
    relative = raw.get("relative_compute")
    return DeviceProfile(
        id=raw["id"], name=raw["name"], ram_mb=raw.get("ram_mb"), budget_mb=raw.get("budget_mb"),
        chip=raw.get("chip"), relative_compute=relative, sources=tuple(raw.get("sources", ())),
        effective_flops=None if relative is None else reference_flops() * relative)


@cache
def reference_flops() -> float:
    return _reference_flops(json.loads(DEVICES_FILE.read_text())["reference"])


def get_device(device_id: str) -> DeviceProfile:
    devices = load_devices()
    if device_id not in devices:
        raise PlanInputError(f"unknown device {device_id!r} (known: {', '.join(devices)})")
    return devices[device_id]


def _reference_flops(reference: dict) -> float:
    """The reference phone's effective FLOP/s: the FLOPs our planner counts for the published
    configuration (default MeBP knobs) over the published seconds per step."""
    from mebp_core.config import EngineKnobs
    from mebp_core.plan.arch import load_architecture
    from mebp_core.plan.timing import count_step_flops
    from mebp_core.plan.workload import Workload

    workload = Workload(arch=load_architecture(reference["model"]),
                        seq_len=reference["seq_len"])
    return count_step_flops(workload, EngineKnobs()) / reference["seconds_per_step"]
