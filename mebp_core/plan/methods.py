"""Every method planned side by side: MeBP, MeZO and plain backprop on one model, setting
and budget, each with its own front, and which of them to run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from mebp_core.config import TrainConfig
from mebp_core.plan.arch import Architecture, PlanInputError
from mebp_core.plan.devices import DeviceProfile
from mebp_core.plan.on_host import plan_on_host
from mebp_core.plan.planner import (
    DEFAULT_MARGIN,
    DEFAULT_TIME_TOLERANCE,
    Plan,
    PlanEntry,
    smallest_within,
    why_recommended,
)

METHODS = ("mebp", "mezo", "backprop")
EXACT_METHODS = ("mebp", "backprop")  # the same gradients; MeZO estimates them
METHOD_NAMES = {"mebp": "MeBP", "mezo": "MeZO", "backprop": "backprop"}


class MethodSettingError(PlanInputError):
    """The training setting does not apply to a method (MeZO with AdamW)."""


def method_config(config: TrainConfig, method: str) -> TrainConfig:
    """``config`` for ``method`` (plain backprop's knobs are fixed, MeZO trains with SGD), or
    ``MethodSettingError`` saying why the setting does not apply to it."""
    try:
        return TrainConfig.model_validate({**config.model_dump(), "method": method})
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise MethodSettingError(f"method {method}: {reason}") from None


@dataclass(frozen=True)
class MethodPlans:
    plans: dict[str, Plan]  # method -> its plan
    skipped: dict[str, str]  # method -> why the setting does not apply to it

    def recommendation(self, time_tolerance: float = DEFAULT_TIME_TOLERANCE) -> dict | None:
        """The method and configuration to run, and why: the smallest exact configuration
        that fits within ``time_tolerance`` of the fastest one (MeBP and backprop give the
        same gradients), else MeZO's recommendation when only it fits. Per step only: MeZO
        needs far more steps to a loss, which a comparison measures."""
        fitting = {m: p.auto for m, p in self.plans.items() if p.auto is not None}
        exact = [e for m in EXACT_METHODS if m in fitting for e in self.plans[m].fitting]
        if exact:
            best = smallest_within(exact, time_tolerance)
            fastest = min(exact, key=_rank)
            why = why_recommended(best, fastest, time_tolerance,
                                  self.plans[best.method].budget_bytes,
                                  among=" exact configuration")
            if "mezo" in fitting and _rank(fitting["mezo"]) < _rank(fastest):
                why += ("; MeZO's step is shorter but it needs many more steps to the same "
                        "loss (a comparison measures the time to a loss)")
        elif "mezo" in fitting:
            mezo = self.plans["mezo"]
            best = mezo.recommended(time_tolerance)
            why = "the only method that fits; " + why_recommended(
                best, mezo.auto, time_tolerance, mezo.budget_bytes)
        else:
            return None
        return {"method": best.method, "configuration": best.id, "why": why}

    def to_json(self, time_tolerance: float = DEFAULT_TIME_TOLERANCE) -> dict:
        return {"method": "all",
                "plans": {method: plan.to_json(time_tolerance)
                          for method, plan in self.plans.items()},
                "skipped": self.skipped, "recommendation": self.recommendation(time_tolerance)}


def _rank(entry: PlanEntry) -> tuple[float, int]:
    return entry.ranking_time_s, entry.prediction.peak_bytes


def plan_methods_on_host(arch: Architecture, config: TrainConfig, methods=METHODS, *,
                         budget_bytes: int | None = None, device: DeviceProfile | None = None,
                         margin: float = DEFAULT_MARGIN, cache_dir: Path | None = None,
                         measure: bool = True) -> MethodPlans:
    """Each method's plan of ``config``'s setting; a method the setting does not apply to
    (MeZO with AdamW) is skipped with the reason. ``measure`` as for ``plan_on_host``."""
    plans, skipped = {}, {}
    for method in methods:
        try:
            method_setting = method_config(config, method)
        except MethodSettingError as exc:
            if len(methods) == 1:
                raise
            skipped[method] = str(exc)
            continue
        plans[method] = plan_on_host(arch, method_setting, budget_bytes=budget_bytes,
                                     device=device, margin=margin, cache_dir=cache_dir,
                                     measure=measure)
    return MethodPlans(plans, skipped)
