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
from mebp_core.plan.planner import DEFAULT_MARGIN, Plan, PlanEntry
from mebp_core.units import MB

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

    def recommendation(self) -> dict | None:
        """The method and configuration to run, and why: the fastest exact configuration
        that fits (MeBP and backprop give the same gradients), else MeZO's when only it fits.
        Per step only: MeZO needs far more steps to a loss, which a comparison measures."""
        fitting = {m: p.auto for m, p in self.plans.items() if p.auto is not None}
        exact = [fitting[m] for m in EXACT_METHODS if m in fitting]
        if exact:
            best = min(exact, key=_rank)
            why = f"fastest per step among exact methods ({_fits(best, self.plans[best.method])})"
            if "mezo" in fitting and _rank(fitting["mezo"]) < _rank(best):
                why += ("; MeZO's step is shorter but it needs many more steps to the same "
                        "loss (a comparison measures the time to a loss)")
        elif "mezo" in fitting:
            best = fitting["mezo"]
            why = f"the only method that fits ({_fits(best, self.plans['mezo'])})"
        else:
            return None
        return {"method": best.method, "configuration": best.id, "why": why}

    def to_json(self) -> dict:
        return {"method": "all",
                "plans": {method: plan.to_json() for method, plan in self.plans.items()},
                "skipped": self.skipped, "recommendation": self.recommendation()}


def _rank(entry: PlanEntry) -> tuple[float, int]:
    return entry.ranking_time_s, entry.prediction.peak_bytes


def _fits(entry: PlanEntry, plan: Plan) -> str:
    peak = f"{entry.prediction.peak_bytes / MB:.0f} MB"
    if plan.budget_bytes is None:
        return f"peak {peak}"
    return f"peak {peak}, fits {plan.budget_bytes / MB:.0f} MB"


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
