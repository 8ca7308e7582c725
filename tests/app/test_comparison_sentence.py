"""The comparison's sentence from its measurements: who reached whose best loss and when, one
method alone, runs still going, failures, methods that did not run, no device estimate."""

from __future__ import annotations

from app.comparison_schemas import ComparisonRun, CurvePoint, MethodOutcome
from app.comparison_sentence import phone_time, summarize
from app.job_schemas import JobError


def curve(losses: list[float], step_s: float | None, every: int = 10) -> list[CurvePoint]:
    return [CurvePoint(step=every * (i + 1), val_loss=loss,
                       device_time_s=None if step_s is None else step_s * every * (i + 1),
                       host_time_s=float(i)) for i, loss in enumerate(losses)]


def run(method: str, losses: list[float], step_s: float | None = 1.0, status="succeeded",
        error: str | None = None, lr: float = 0.01) -> ComparisonRun:
    points = curve(losses, step_s)
    return ComparisonRun(
        job_id=f"job-{method}-{lr}", method=method, learning_rate=lr, status=status,
        error=None if error is None else JobError(code=error, message=error), step=0,
        total_steps=10 * len(losses), predicted_peak_mb=None, measured_peak_mb=None,
        device_step_time_s_estimate=step_s, best_val_loss=min(losses, default=None),
        final_val_loss=None, curve=points)


def outcome(method: str, runs: list[ComparisonRun], verdict="runs",
            reason: str | None = None) -> MethodOutcome:
    scored = [r for r in runs if r.best_val_loss is not None]
    best = min(scored, key=lambda r: r.best_val_loss, default=None)
    return MethodOutcome(
        method=method, verdict=verdict, reason=reason, smallest_budget_mb=None, steps=None,
        device_step_time_s_estimate=None, predicted_peak_mb=None, measured_peak_mb=None,
        best_learning_rate=best and best.learning_rate, best_job_id=best and best.job_id,
        best_val_loss=best and best.best_val_loss, best_curve=best.curve if best else [],
        runs=runs)


def test_phone_time_reads_as_a_person_says_it():
    assert [phone_time(s) for s in (0.44, 5.25, 42, 360, 11_400, 3 * 86_400 + 7200)] == \
        ["0.44 s", "5.2 s", "42 s", "6 min", "3 h 10 min", "3 d 2 h"]


def test_the_faster_method_reached_the_others_best_loss_sooner():
    mebp = outcome("mebp", [run("mebp", [5.0, 4.1, 3.9], step_s=36)])  # 4.1 at 720 s
    mezo = outcome("mezo", [run("mezo", [5.5, 4.5, 4.12, 4.2], step_s=285)])  # 4.12 at 8550 s
    assert summarize([mebp, mezo]) == (
        "MeBP reached MeZO's best loss (4.12) in 12 min of phone time; MeZO needed "
        "2 h 22 min (11.9x longer).")


def test_one_method_alone_and_one_that_does_not_fit():
    mebp = outcome("mebp", [run("mebp", [4.0, 3.5], step_s=None, lr=0.05)])
    backprop = outcome("backprop", [], "does_not_fit",
                       "backprop is predicted not to fit 512 MB; its smallest budget is 900 MB")
    assert summarize([mebp, backprop]) == (
        "Only MeBP has a validation curve: its best loss 3.5 (learning rate 0.05) after 20 "
        "steps (no device estimate); backprop is predicted not to fit 512 MB; its smallest "
        "budget is 900 MB.")


def test_running_and_failed_runs_are_said():
    mebp = outcome("mebp", [run("mebp", [4.0], status="running"),
                            run("mebp", [9.0], status="failed", error="training_diverged",
                                lr=1.0)])
    mezo = outcome("mezo", [run("mezo", [], status="failed", error="memory_budget_exceeded")])
    sentence = summarize([mebp, mezo])
    assert sentence.startswith("So far (1 of 3 jobs still to finish): Only MeBP has a "
                               "validation curve: its best loss 4"), sentence
    assert "1 of 2 MeBP runs failed (training_diverged)" in sentence
    assert "every MeZO run failed (memory_budget_exceeded)" in sentence


def test_nothing_measured_yet_or_ever():
    queued = outcome("mebp", [run("mebp", [], status="queued")])
    assert summarize([queued]) == "So far (1 of 1 jobs still to finish): No validation " \
        "loss yet."
    cancelled = outcome("mebp", [run("mebp", [], status="cancelled")])
    assert summarize([cancelled]) == "No run produced a validation loss."
