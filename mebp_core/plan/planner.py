"""Every knob combination for a workload: predicted, judged against a budget, Pareto-ranked.

``make_plan`` is the Python API the CLI and the service call; it never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mebp_core.config import EngineKnobs
from mebp_core.errors import MebpError
from mebp_core.plan.calibration import HostCalibration
from mebp_core.plan.devices import DeviceProfile, mezo_device_step_time
from mebp_core.plan.grid import candidate_knobs
from mebp_core.plan.predict import Prediction, predict, under_budget
from mebp_core.plan.workload import Workload, canonical_workload
from mebp_core.units import MB

DEFAULT_MARGIN = 0.10  # a configuration fits when its predicted peak * 1.10 is within budget
# the recommendation gives up at most this much of the fastest step time for less memory
DEFAULT_TIME_TOLERANCE = 0.03
# a plan shows a host's step time to 0.1 ms and a phone's estimate to 1 ms; its front is
# judged on the figures as shown
HOST_TIME_DECIMALS, DEVICE_TIME_DECIMALS = 4, 3


@dataclass(frozen=True)
class PlanEntry:
    id: str
    knobs: EngineKnobs
    prediction: Prediction
    feasible: bool | None  # None: no budget given
    reason: str | None  # why it does not fit
    pareto: bool
    device_step_time_s: float | None  # the device model's estimate, if a device is given
    method: str = "mebp"

    @property
    def ranking_time_s(self) -> float:
        """The time a plan ranks by: the phone's when a device is given, else this host's."""
        return self.prediction.step_time_s if self.device_step_time_s is None \
            else self.device_step_time_s

    @property
    def shown_time_s(self) -> float:
        """``ranking_time_s`` as the plan shows it: its front and ``auto`` are judged on it."""
        return shown_time_s(self.prediction.step_time_s, self.device_step_time_s)

    def to_json(self) -> dict:
        p = self.prediction
        return {
            "id": self.id,
            "method": self.method,
            "knobs": self.knobs.model_dump(mode="json", exclude={"threads"}),
            "peak_mb": round(p.peak_bytes / MB, 1),
            "memory_mb": {name: round(value / MB, 1) for name, value in p.memory.items()},
            "step_time_s": round(p.step_time_s, HOST_TIME_DECIMALS),
            "time_s": {name: round(value, 4) for name, value in p.time.items()},
            "feasible": self.feasible, "reason": self.reason, "pareto": self.pareto,
            "device_step_time_s_estimate": None if self.device_step_time_s is None
            else round(self.device_step_time_s, DEVICE_TIME_DECIMALS),
        }


@dataclass(frozen=True)
class Plan:
    workload: Workload
    budget_bytes: int | None
    margin: float
    device: DeviceProfile | None
    entries: tuple[PlanEntry, ...]
    calibration: dict | None = None  # which host calibration the predictions came from

    def device_mezo_step_time_s(self) -> float | None:
        """MeZO on the device for the same workload, weights lazy (its plan's
        ``mezo-lazy-tile8M`` without the budget's store re-reads)."""
        if self.device is None or self.device.rates is None:
            return None
        return round(mezo_device_step_time(self.workload, self.device.rates), 3)

    @property
    def pareto(self) -> list[PlanEntry]:
        return sorted((e for e in self.entries if e.pareto),
                      key=lambda e: e.prediction.peak_bytes)

    @property
    def fitting(self) -> list[PlanEntry]:
        """The configurations that fit the budget (every one without a budget)."""
        return [e for e in self.entries if e.feasible is not False]

    @property
    def auto(self) -> PlanEntry | None:
        """The fastest configuration that fits (the fastest overall without a budget)."""
        fitting = self.fitting
        if not fitting:
            return None
        return min(fitting, key=lambda e: (e.shown_time_s, e.prediction.peak_bytes))

    def recommended(self, time_tolerance: float = DEFAULT_TIME_TOLERANCE) -> PlanEntry | None:
        """The smallest configuration that fits whose step time is within ``time_tolerance``
        of ``auto``'s: a near-tie in time should not cost hundreds of MB."""
        return smallest_within(self.fitting, time_tolerance)

    def recommendation(self, time_tolerance: float = DEFAULT_TIME_TOLERANCE) -> dict | None:
        """``recommended``'s id and why, in words, or None when nothing fits."""
        chosen = self.recommended(time_tolerance)
        if chosen is None:
            return None
        return {"method": chosen.method, "configuration": chosen.id,
                "why": why_recommended(chosen, self.auto, time_tolerance, self.budget_bytes)}

    @property
    def largest_fitting_peak_bytes(self) -> float | None:
        """The peak at which a configuration stops fitting: the budget less the margin."""
        return None if self.budget_bytes is None else self.budget_bytes / (1 + self.margin)

    @property
    def smallest(self) -> PlanEntry:
        return min(self.entries, key=lambda e: (e.prediction.peak_bytes, e.ranking_time_s))

    @property
    def ranked_by(self) -> str:
        """"device" when the plan's times are the phone's estimates, else "host"."""
        return "host" if any(e.device_step_time_s is None for e in self.entries) else "device"

    def smallest_budget_bytes(self) -> int:
        """The least budget under which some configuration fits, margin included."""
        return math.ceil(self.smallest.prediction.peak_bytes * (1 + self.margin))

    def smallest_budget_mb(self) -> int:
        """That budget in whole MB, rounded up: asking for it always fits."""
        return math.ceil(self.smallest_budget_bytes() / MB)

    def to_json(self, time_tolerance: float = DEFAULT_TIME_TOLERANCE) -> dict:
        auto = self.auto
        smallest = self.smallest
        fits_below = self.largest_fitting_peak_bytes
        arch = self.workload.arch
        return {
            "method": self.workload.method,
            "workload": {"model_type": arch.model_type, "parameters": arch.parameter_count(),
                         "method": self.workload.method,
                         "seq_len": self.workload.seq_len,
                         "batch_size": self.workload.batch_size,
                         "lora_rank": self.workload.lora.rank,
                         "lora_targets": list(self.workload.lora.targets),
                         "optimizer": self.workload.optimizer,
                         "compute_dtype": self.workload.compute_dtype,
                         "quant": self.workload.quant, "group_size": self.workload.group_size},
            "budget_mb": None if self.budget_bytes is None else round(self.budget_bytes / MB, 1),
            "margin": self.margin,
            "largest_fitting_peak_mb": None if fits_below is None else round(fits_below / MB, 1),
            "calibration": self.calibration,
            "device": None if self.device is None else self.device.to_json(),
            "device_mezo_step_time_s_estimate": self.device_mezo_step_time_s(),
            "ranked_by": self.ranked_by,
            "auto": None if auto is None else auto.id,
            "time_tolerance": time_tolerance,
            "recommendation": self.recommendation(time_tolerance),
            "feasible": None if self.budget_bytes is None else auto is not None,
            "smallest_budget_mb": self.smallest_budget_mb(),
            "dominant_component": smallest.prediction.dominant_component(),
            "pareto": [e.id for e in self.pareto],
            "configurations": [e.to_json() for e in self.entries],
        }


def smallest_within(entries: list[PlanEntry], time_tolerance: float) -> PlanEntry | None:
    """The entry of least peak memory whose ranking time is within ``time_tolerance`` of the
    fastest entry's (the fastest itself when nothing smaller is that close)."""
    if not entries:
        return None
    fastest = min(e.ranking_time_s for e in entries)
    close = [e for e in entries if e.ranking_time_s <= fastest * (1 + time_tolerance)]
    return min(close, key=lambda e: (e.prediction.peak_bytes, e.ranking_time_s))


def why_recommended(chosen: PlanEntry, fastest: PlanEntry, time_tolerance: float,
                    budget_bytes: int | None, among: str = "") -> str:
    """``chosen`` said as the smallest within the tolerance of ``fastest``, with both figures,
    e.g. "smallest within 3% of the fastest that fits (4.05 s/step at 821 MB): 4.08 s/step
    at 350 MB, fits 1024 MB"."""
    def figures(entry: PlanEntry) -> str:
        return f"{entry.ranking_time_s:.3g} s/step at {entry.prediction.peak_bytes / MB:.0f} MB"
    fits = "" if budget_bytes is None else f", fits {budget_bytes / MB:.0f} MB"
    that_fits = "" if budget_bytes is None else " that fits"
    rule = f"smallest within {time_tolerance * 100:g}% of the fastest{among}{that_fits}"
    if chosen.id == fastest.id:
        return f"{rule}: the fastest itself ({figures(chosen)}){fits}"
    return f"{rule} ({figures(fastest)}): {figures(chosen)}{fits}"


def knobs_id(knobs: EngineKnobs, method: str = "mebp") -> str:
    """A short readable name, e.g. ``lazy-ckpt1-ram-recompute-shared-tile8M`` (MeBP's),
    ``mezo-lazy-tile8M``, ``backprop``: only the knobs the method uses."""
    if method == "backprop":
        return "backprop"
    if knobs.frozen_weights == "lazy":
        weights = "lazy"
    elif knobs.resident_weight_bytes is None:
        weights = "resident"
    else:
        weights = f"resident{_size(knobs.resident_weight_bytes)}"
    tiles = f"tile{_size(knobs.decompress_tile_bytes)}"
    if knobs.loss_vocab_tile_bytes != knobs.decompress_tile_bytes:
        tiles += f"-loss{_size(knobs.loss_vocab_tile_bytes)}"
    if method == "mezo":
        parts = ["mezo", weights, tiles]
    else:
        every = knobs.checkpoint_blocks
        checkpoints = "nockpt" if every == "none" else \
            f"ckpt{every}-{knobs.checkpoint_storage}"
        if knobs.graph_tail_blocks and every != "none":
            checkpoints += f"-tail{knobs.graph_tail_blocks}"
        parts = [weights, checkpoints, f"h-{knobs.lora_hidden}",
                 _SHARING[knobs.share_decompression], tiles]
    if knobs.mlp_chunk_tokens is not None:
        parts.append(f"mlp{knobs.mlp_chunk_tokens}")
    if knobs.mlp_intermediate_chunk is not None:
        parts.append(f"mlpi{knobs.mlp_intermediate_chunk}")
    if knobs.store_reads == "direct":
        parts.append("direct")
    return "-".join(parts)


_SHARING = {True: "shared", False: "unshared", "auto": "share-auto"}


def _size(nbytes: int) -> str:
    """Exact and short: ``8M`` for 8 MiB, ``1536K``, ``1000B``."""
    for unit, scale in (("M", MB), ("K", 1 << 10)):
        if nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def make_plan(workload: Workload, host: HostCalibration, *, budget_bytes: int | None = None,
              device: DeviceProfile | None = None, margin: float = DEFAULT_MARGIN,
              knobs: list[EngineKnobs] | None = None, bf16_matmul: str = "auto") -> Plan:
    """Predict every candidate (or the given knobs) and mark feasibility and the front.

    The budget is ``budget_bytes`` if given, else the device's. The candidates run their
    bf16 matmuls as ``bf16_matmul`` says (a choice of the host, not a trade-off)."""
    if budget_bytes is None and device is not None:
        budget_bytes = device.budget_bytes
    workload = canonical_workload(workload)
    candidates = knobs if knobs is not None else \
        candidate_knobs(workload, host.threads, bf16_matmul)
    predictions = [(k, predict(workload, k, host)) for k in candidates]
    if budget_bytes is not None:
        predictions = [(k, under_budget(p, budget_bytes, host)) for k, p in predictions]
    device_times = [None if device is None else
                    device.estimate_step_time(p, workload, budget_bytes)
                    for _, p in predictions]
    # with a device that has rates, the front and auto are the phone's: ranked by its time
    front = _pareto_ids([(p, shown_time_s(p.step_time_s, device_time))
                         for (_, p), device_time in zip(predictions, device_times, strict=True)])
    entries = []
    for (k, p), device_time in zip(predictions, device_times, strict=True):
        feasible, reason = None, None
        if budget_bytes is not None:
            needed = p.peak_bytes * (1 + margin)
            feasible = needed <= budget_bytes
            if not feasible:
                reason = (f"needs {math.ceil(needed / MB)} MB with the {margin:.0%} margin, budget "
                          f"{budget_bytes / MB:.0f} MB; largest part: "
                          f"{p.dominant_component()} {max(p.memory.values()) / MB:.0f} MB")
        entries.append(PlanEntry(knobs_id(k, workload.method), k, p, feasible, reason,
                                 id(p) in front, device_time, workload.method))
    return Plan(workload, budget_bytes, margin, device, tuple(entries), host.provenance())


class InfeasibleBudgetError(MebpError, ValueError):
    """No configuration is predicted to fit the budget; says the smallest budget that would."""

    def __init__(self, plan: Plan) -> None:
        self.smallest_budget_mb = plan.smallest_budget_mb()
        self.dominant_component = plan.smallest.prediction.dominant_component()
        super().__init__(
            f"no configuration fits {plan.budget_bytes / MB:.0f} MB (with the "
            f"{plan.margin:.0%} margin); the smallest budget that fits is "
            f"{self.smallest_budget_mb} MB, where {self.dominant_component} dominates")


def shown_time_s(host_step_time_s: float, device_step_time_s: float | None) -> float:
    """The step time a plan ranks by (the phone's estimate when there is one), rounded as the
    plan shows it."""
    if device_step_time_s is None:
        return round(host_step_time_s, HOST_TIME_DECIMALS)
    return round(device_step_time_s, DEVICE_TIME_DECIMALS)


def _pareto_ids(timed: list[tuple[Prediction, float]]) -> set[int]:
    """Configurations no other one beats on both peak memory and step time as a plan shows
    them (the peak to 0.1 MB, ``timed``'s shown times): one that holds more to save less
    than is shown is not on the front."""
    shown = [(round(p.peak_bytes / MB, 1), seconds, p) for p, seconds in timed]
    front, best_time = set(), float("inf")
    for _, seconds, p in sorted(shown, key=lambda row: row[:2]):
        if seconds < best_time:
            front.add(id(p))
            best_time = seconds
    return front
