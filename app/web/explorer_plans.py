"""The explorer's plans, one method's or every method's, as its page and chart read them:
each method's plan, every configuration (each labelled with its method) and the
recommendation, naming the method, why, and its knobs in words."""

from __future__ import annotations

from app.web.knob_words import describe_knobs
from mebp_core.config import TrainConfig
from mebp_core.config_args import value_kinds
from mebp_core.plan.methods import METHOD_NAMES, METHODS

METHOD_CHOICES = (*METHODS, "all")
COMPUTE_DTYPES = value_kinds(TrainConfig.model_fields["compute_dtype"].annotation)[1]


def plan_view(answer: dict) -> dict:
    """``/v1/plans``' answer as JSON (one method's plan, or ``method=all``'s plans) -> what
    the page shows: ``plans`` (method -> plan), ``skipped`` (method -> why it is not
    planned), ``configurations`` (every method's), ``recommendation`` (or None)."""
    if answer["method"] == "all":
        plans, skipped = answer["plans"], answer["skipped"]
    else:
        plans, skipped = {answer["method"]: answer}, {}
    recommendation = answer["recommendation"]
    configurations = [c for plan in plans.values() for c in plan["configurations"]]
    if recommendation is not None:
        chosen = next(c for c in configurations if c["id"] == recommendation["configuration"])
        words = describe_knobs(chosen["knobs"], chosen["method"])
        recommendation = {**recommendation, "name": METHOD_NAMES[recommendation["method"]],
                          "knobs": words[:1].upper() + words[1:]}
    return {"method": answer["method"], "plans": plans, "skipped": skipped,
            "names": {method: METHOD_NAMES[method] for method in plans},
            "configurations": configurations, "recommendation": recommendation}

