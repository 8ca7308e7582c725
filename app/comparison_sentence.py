"""What a comparison's measurements say, in words a person can act on: which method reached
the others' best validation loss, and how much sooner in phone time."""

from __future__ import annotations

from collections import Counter

from app.comparison_schemas import CurvePoint, MethodOutcome

NAMES = {"mebp": "MeBP", "mezo": "MeZO", "backprop": "backprop"}
TERMINAL = {"succeeded", "failed", "cancelled"}


def phone_time(seconds: float) -> str:
    """0.44 s, 42 s, 6 min, 3 h 10 min, 2 d 5 h."""
    if seconds < 10:
        return f"{seconds:.2g} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def when(point: CurvePoint) -> str:
    if point.device_time_s is None:
        return f"{point.step} steps (no device estimate)"
    return f"{phone_time(point.device_time_s)} of phone time"


def first_reaching(curve: list[CurvePoint], loss: float) -> CurvePoint | None:
    return next((point for point in curve if point.val_loss <= loss), None)


def race(winner: MethodOutcome, other: MethodOutcome) -> str:
    """How soon ``winner`` (the lower best loss) reached ``other``'s best, against the time
    ``other`` took to get there."""
    target = other.best_val_loss
    reached, needed = first_reaching(winner.best_curve, target), \
        first_reaching(other.best_curve, target)
    name, other_name = NAMES[winner.method], NAMES[other.method]
    if reached is None:  # cannot happen for the lower best loss, but say so if it does
        return f"{name} never reached {other_name}'s best loss ({target:.4g})"
    took = phone_time(needed.device_time_s) if reached.device_time_s is not None and \
        needed.device_time_s is not None else when(needed)  # "of phone time" said once
    sentence = (f"{name} reached {other_name}'s best loss ({target:.4g}) in {when(reached)}; "
                f"{other_name} needed {took}")
    if reached.device_time_s and needed.device_time_s:
        ratio = needed.device_time_s / reached.device_time_s
        if ratio >= 1.05:
            sentence += f" ({ratio:.3g}x longer)"
    return sentence


def failures(outcome: MethodOutcome) -> str | None:
    failed = [run for run in outcome.runs if run.status == "failed"]
    if not failed:
        return None
    codes = ", ".join(f"{code}" + (f" x{n}" if n > 1 else "") for code, n in
                      Counter(run.error.code if run.error else "failed" for run in failed)
                      .items())
    name = NAMES[outcome.method]
    if len(failed) == len(outcome.runs):
        return f"every {name} run failed ({codes})"
    return f"{len(failed)} of {len(outcome.runs)} {name} runs failed ({codes})"


def summarize(methods: list[MethodOutcome]) -> str:
    runs = [run for outcome in methods for run in outcome.runs]
    unfinished = sum(run.status not in TERMINAL for run in runs)
    curved = sorted((m for m in methods if m.best_val_loss is not None),
                    key=lambda m: m.best_val_loss)
    parts = []
    if len(curved) >= 2:
        parts += [race(curved[0], other) for other in curved[1:]]
    elif len(curved) == 1:
        best = curved[0]
        point = first_reaching(best.best_curve, best.best_val_loss)
        alone = "has a validation curve" if len(methods) > 1 else "ran"
        parts.append(f"only {NAMES[best.method]} {alone}: its best loss "
                     f"{best.best_val_loss:.4g} (learning rate {best.best_learning_rate:g}) "
                     f"after {when(point)}")
    elif unfinished:
        parts.append("no validation loss yet")
    else:
        parts.append("no run produced a validation loss")
    parts += [m.reason for m in methods if m.verdict != "runs" and m.reason]
    parts += [text for m in methods if (text := failures(m))]
    sentence = "; ".join(parts)
    sentence = sentence[0].upper() + sentence[1:] + "."
    if unfinished:
        sentence = f"So far ({unfinished} of {len(runs)} jobs still to finish): {sentence}"
    return sentence
