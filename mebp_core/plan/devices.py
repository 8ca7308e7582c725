"""Device profiles (MISSION section 5) from ``devices.json``, which cites its sources, and
the on-device step-time estimate.

A step's estimated time on a phone sums the parts the host prediction has (``timing.
StepWork``), each priced at the phone's rates: matmul FLOPs at its effective throughput,
decompression (the packed weights read, the 16-bit tiles written) and elementwise traffic at
its memory bandwidth, the blocks' dispatched ops and dequantization calls at its per-op
overhead (not the loss tiles' ops, which the host prices: the per-op figure is fitted to the
MeBP paper's engine, whose loss is not ours),
and the store re-reads a budget forces at its storage speed, each byte also faulted in at
``store_reads.MAPPED_REREAD_FAULT_BYTES_PER_S`` (measured on hosts, not on a phone). So
every knob moves it: a
graph tail, for one, saves its blocks' recompute (FLOPs and dispatched ops) at the same
decompressions.

Two constants are fitted, on the reference phone alone: its effective throughput and its
per-op overhead, from one model's published MeBP and MeZO step times. Another phone runs
``relative_compute`` times faster in both (or as fast as fits a published figure of its
own), at its own memory bandwidth and storage speed where they are known.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from mebp_core.config import EngineKnobs
from mebp_core.plan.arch import PlanInputError, load_architecture
from mebp_core.plan.store_reads import file_room_bytes, mapped_reread_bytes
from mebp_core.plan.timing import TRAFFIC_MULTIPLIER, StepWork, step_work
from mebp_core.plan.workload import Workload, packed_bytes_per_param
from mebp_core.units import MB

DEVICES_FILE = Path(__file__).with_name("devices.json")
GB = 1e9
ON_DEVICE_BYTES = 2  # phones compute in 16 bits: decompressed tiles are written as such


@dataclass(frozen=True)
class DeviceRates:
    matmul_flops: float  # FLOP/s, effective (fitted)
    op_overhead_s: float  # per dispatched op (fitted)
    memory_bytes_per_s: float
    storage_bytes_per_s: float


@dataclass(frozen=True)
class DeviceProfile:
    id: str
    name: str
    ram_mb: int | None
    budget_mb: int | None
    chip: str | None
    relative_compute: float | None
    sources: tuple[str, ...]
    rates: DeviceRates | None = None  # None: no time estimate (a custom budget)

    @property
    def budget_bytes(self) -> int | None:
        return None if self.budget_mb is None else self.budget_mb * MB

    def estimate_step_time(self, prediction, workload, budget_bytes: int | None) -> float | None:
        """Seconds per step on this phone for a prediction of ``workload`` under
        ``budget_bytes`` (the store pages that do not fit beside the peak are read again
        by every sweep; a direct step's own reads beside them), or None."""
        if self.rates is None:
            return None
        rereads = 0.0
        if budget_bytes is not None:
            room = file_room_bytes(budget_bytes, prediction.peak_bytes) - \
                prediction.checkpoint_file_bytes  # as ``predict.under_budget`` leaves it
            rereads = mapped_reread_bytes(prediction.store_bytes, prediction.store_read_bytes,
                                          room, self.rates.storage_bytes_per_s)
        return sum(device_step_time(prediction.device_work, workload, self.rates,
                                    rereads + prediction.direct_read_cost_bytes).values())

    def to_json(self) -> dict:
        rates = self.rates
        return {"id": self.id, "name": self.name, "ram_mb": self.ram_mb,
                "budget_mb": self.budget_mb, "chip": self.chip,
                "relative_compute_estimate": self.relative_compute,
                "effective_gflops_estimate": None if rates is None
                else round(rates.matmul_flops / GB, 1),
                "memory_gb_s": None if rates is None else rates.memory_bytes_per_s / GB,
                "sources": list(self.sources)}


def device_step_time(work: StepWork, workload, rates: DeviceRates,
                     store_read_bytes: float = 0) -> dict[str, float]:
    """Seconds per step by part at a phone's rates (the host prediction's parts)."""
    per_param = packed_bytes_per_param(workload) + ON_DEVICE_BYTES  # read packed, write 16-bit
    decompressed = work.tile_params + work.whole_params
    return {"matmul": work.matmul_flops / rates.matmul_flops,
            "decompress": decompressed * per_param / rates.memory_bytes_per_s,
            "elementwise": TRAFFIC_MULTIPLIER * work.traffic_bytes / rates.memory_bytes_per_s,
            # not work.loss_tile_ops (the module's docstring)
            "overhead": (work.ops + work.decompress_calls) * rates.op_overhead_s,
            "disk": store_read_bytes / rates.storage_bytes_per_s}


def mezo_device_step_time(workload: Workload, rates: DeviceRates) -> float:
    """MeZO's step on a phone for ``workload``'s model and setting: two forwards without
    autograd, weights lazy and decompressed in tiles, in the phone's own 16-bit math (never
    this host's bf16 path: no upcasts)."""
    mezo = replace(workload, method="mezo")
    work = step_work(mezo, EngineKnobs(bf16_matmul="native"), set())
    return sum(device_step_time(work, mezo, rates).values())


@cache
def load_devices() -> dict[str, DeviceProfile]:
    raw = json.loads(DEVICES_FILE.read_text())
    return {entry["id"]: make_profile(entry) for entry in raw["devices"]}


def make_profile(raw: dict) -> DeviceProfile:
    """A profile from its fields (as in devices.json or the devices table); its rates from
    the reference phone's, scaled by ``relative_compute`` or fitted to ``fit``."""
    relative = raw.get("relative_compute")
    profile = DeviceProfile(
        id=raw["id"], name=raw["name"], ram_mb=raw.get("ram_mb"),
        budget_mb=raw.get("budget_mb"), chip=raw.get("chip"), relative_compute=relative,
        sources=tuple(raw.get("sources", ())))
    if relative is None and raw.get("fit") is None:
        return profile
    reference = reference_rates()
    memory = raw.get("memory_gb_s")
    storage = raw.get("storage_gb_s")
    base = replace(reference,
                   memory_bytes_per_s=memory * GB if memory else reference.memory_bytes_per_s,
                   storage_bytes_per_s=storage * GB if storage else
                   reference.storage_bytes_per_s)
    if raw.get("fit") is not None:
        relative = _fitted_relative_compute(raw["fit"], base)
    rates = replace(base, matmul_flops=base.matmul_flops * relative,
                    op_overhead_s=base.op_overhead_s / relative)
    return replace(profile, relative_compute=round(relative, 3), rates=rates)


def get_device(device_id: str) -> DeviceProfile:
    devices = load_devices()
    if device_id not in devices:
        raise PlanInputError(f"unknown device {device_id!r} (known: {', '.join(devices)})")
    return devices[device_id]


def paper_workload(model: str, seq_len: int, method: str = "mebp") -> Workload:
    """The MeBP paper's setting on a phone: 16-bit compute, 4-bit group-64 weights, LoRA
    rank 8 on the 7 projections, batch 1."""
    return Workload(arch=load_architecture(model), seq_len=seq_len, method=method,
                    compute_dtype="bfloat16")


def paper_knobs(lora_hidden: str = "store") -> EngineKnobs:
    """MeBP's configuration: weights decompressed per block on demand, once for a block's
    recompute and backward, every block input checkpointed, LoRA's h kept (MeSP recomputes
    it: ``lora_hidden="recompute"``)."""
    return EngineKnobs(bf16_matmul="native", share_decompression=True, lora_hidden=lora_hidden)


def paper_step_work(model: str, seq_len: int, method: str,
                    lora_hidden: str = "store") -> tuple[StepWork, Workload]:
    workload = paper_workload(model, seq_len, method)
    # the paper's engine recomputes each block whole: its timings are fitted on that work
    return step_work(workload, paper_knobs(lora_hidden), set(),
                     recompute_skips_residual_output=False), workload


@cache
def reference_rates() -> DeviceRates:
    """The reference phone's throughput and per-op overhead, solved from its published MeBP
    and MeZO step times of one model (two equations, two unknowns)."""
    reference = json.loads(DEVICES_FILE.read_text())["reference"]
    memory = reference["memory_gb_s"] * GB
    rows = []
    for method in ("mebp", "mezo"):
        work, workload = paper_step_work(reference["model"], reference["seq_len"], method)
        known = device_step_time(work, workload, DeviceRates(1.0, 0.0, memory, 1.0))
        rows.append((work.matmul_flops, work.ops + work.decompress_calls,
                     reference[f"{method}_seconds_per_step"] - known["decompress"] -
                     known["elementwise"]))
    (f1, o1, t1), (f2, o2, t2) = rows
    det = f1 * o2 - f2 * o1
    seconds_per_flop = (t1 * o2 - t2 * o1) / det
    seconds_per_op = (f1 * t2 - f2 * t1) / det
    if seconds_per_flop <= 0 or seconds_per_op < 0:
        raise ValueError("devices.json: the reference step times admit no positive "
                         "throughput and overhead")
    return DeviceRates(matmul_flops=1 / seconds_per_flop, op_overhead_s=seconds_per_op,
                       memory_bytes_per_s=memory,
                       storage_bytes_per_s=reference["storage_gb_s"] * GB)


def _fitted_relative_compute(fit: dict, base: DeviceRates) -> float:
    """How much faster than the reference a phone computes and dispatches, for its
    published step time ``fit`` (memory traffic at its own bandwidth)."""
    work, workload = paper_step_work(fit["model"], fit["seq_len"], fit.get("method", "mebp"),
                                     fit.get("lora_hidden", "store"))
    parts = device_step_time(work, workload, base)
    scaled = parts["matmul"] + parts["overhead"]
    return scaled / (fit["seconds_per_step"] - parts["decompress"] - parts["elementwise"])
