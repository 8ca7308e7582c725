"""What a comparison measured, shown beside the explorer's predicted fronts: the tenant's
latest comparison of the model on the device that runs or has finished, its sentence, and
each method's best validation loss with the phone time it took to reach it."""

from __future__ import annotations

from sqlmodel import Session, col, select

from app.comparison_schemas import ComparisonPublic, MethodOutcome
from app.comparison_sentence import first_reaching, phone_time
from app.comparison_view import comparison_public
from mebp_core.plan.methods import METHOD_NAMES
from service.models import Comparison

SHOWN = ("running", "done")  # a queued comparison has measured nothing yet
LOOK_BACK = 10  # the newest comparisons searched for one that runs or has finished


def latest_comparison(session: Session, *, tenant: str, model: str,
                      device: str) -> dict | None:
    """The newest running or finished comparison of ``model`` on ``device``, as the
    explorer shows it; None when there is none."""
    newest = session.exec(select(Comparison).where(
        Comparison.tenant == tenant, Comparison.model == model, Comparison.device_id == device)
        .order_by(col(Comparison.created_at).desc()).limit(LOOK_BACK)).all()
    for comparison in newest:
        public = comparison_public(session, comparison)
        if public.status in SHOWN:
            return _shown(public, comparison.spec.request.hyperparameters.seq_len)
    return None


def _shown(public: ComparisonPublic, seq_len: int | None) -> dict:
    return {"id": public.id, "status": public.status, "summary": public.summary,
            "budget_mb": public.memory_budget_mb, "seq_len": seq_len,
            "methods": [_method(outcome) for outcome in public.methods]}


def _method(outcome: MethodOutcome) -> dict:
    """A method's best validation loss and when its best run first reached it."""
    reached = None if outcome.best_val_loss is None else \
        first_reaching(outcome.best_curve, outcome.best_val_loss)
    device_time_s = None if reached is None else reached.device_time_s
    return {"method": outcome.method, "name": METHOD_NAMES[outcome.method],
            "verdict": outcome.verdict, "reason": outcome.reason,
            "best_val_loss": outcome.best_val_loss,
            "best_learning_rate": outcome.best_learning_rate,
            "step": None if reached is None else reached.step,
            "device_time_s": device_time_s,
            "device_time": None if device_time_s is None else phone_time(device_time_s),
            "measured_peak_mb": outcome.measured_peak_mb}
