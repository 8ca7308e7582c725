"""Convergence: mebp against mezo on a real corpus, validation loss against steps and
wall-clock, from the same LoRA init and the same data order.

Both runs go through the engine's ``train()`` with a fixed validation subset evaluated every
few steps. Wall-clock is the cumulative training step time (``step_time_s``): validation and
loading are excluded, so it measures what each method spends learning. The question asked:
when does mebp first reach the validation loss mezo has after its last step, and how many
times sooner is that than mezo's own time?
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from mebp_core.bench.corpus import write_docstring_corpus
from mebp_core.bench.side_by_side import log, machine_info

TARGET_SPEEDUP = 10.0


@dataclass(frozen=True)
class ConvergenceSpec:
    model: str = "preset:tiny"
    seq_len: int = 128
    mezo_steps: int = 2000
    mezo_lr: float = 1e-3  # the best of 3e-4..1e-2 over 200 steps on tiny
    mezo_eps: float = 1e-3
    mezo_eval_every: int = 100
    mebp_steps: int = 200
    mebp_optimizer: str = "adamw"
    mebp_lr: float = 1e-3
    mebp_eval_every: int = 5
    validation_fraction: float = 0.05
    validation_chars: int = 16384
    compute_dtype: str = "float32"
    quant: str = "int4"
    group_size: int = 64
    threads: int | None = None
    seed: int = 0
    max_corpus_files: int | None = None  # for tests: a slice of the stdlib


@dataclass(frozen=True)
class CurvePoint:
    step: int
    wall_s: float  # cumulative training step time up to and including this step
    val_loss: float


def read_curve(metrics_path: Path, initial_val_loss: float) -> list[CurvePoint]:
    """The validated steps of a metrics JSONL as a curve, starting at step 0."""
    points, wall_s = [CurvePoint(0, 0.0, initial_val_loss)], 0.0
    for line in metrics_path.read_text().splitlines():
        row = json.loads(line)
        wall_s += row["step_time_s"]
        if "val_loss" in row:
            points.append(CurvePoint(row["step"], wall_s, row["val_loss"]))
    return points


def first_reaching(curve: list[CurvePoint], target: float) -> CurvePoint | None:
    """The first validated point at or below ``target`` (validation grid resolution)."""
    return next((point for point in curve if point.val_loss <= target), None)


def compare_curves(mebp: list[CurvePoint], mezo: list[CurvePoint],
                   target_speedup: float = TARGET_SPEEDUP) -> dict:
    """mebp's time to mezo's final validation loss, and how many times sooner it is."""
    target, mezo_end = mezo[-1].val_loss, mezo[-1]
    reached = first_reaching(mebp, target)
    speedup = (math.inf if reached.wall_s == 0 else mezo_end.wall_s / reached.wall_s) \
        if reached else None
    return {"target_val_loss": target, "mezo_steps": mezo_end.step, "mezo_wall_s": mezo_end.wall_s,
            "mebp_step_at_target": reached.step if reached else None,
            "mebp_wall_s_at_target": reached.wall_s if reached else None,
            "wall_clock_speedup": speedup,
            "step_speedup": mezo_end.step / reached.step if reached and reached.step else None,
            "target_speedup": target_speedup,
            "met": speedup is not None and speedup >= target_speedup}


def train_curve(spec: ConvergenceSpec, method: str, *, model_dir: Path, corpus: dict,
                work_dir: Path, initial_val_loss: float) -> list[CurvePoint]:
    from mebp_core.config import EngineKnobs, TrainConfig
    from mebp_core.engine.memory import track_memory
    from mebp_core.engine.train import train

    mezo = method == "mezo"
    config = TrainConfig(
        method=method, steps=spec.mezo_steps if mezo else spec.mebp_steps,
        seq_len=spec.seq_len, optimizer="sgd" if mezo else spec.mebp_optimizer,
        lr=spec.mezo_lr if mezo else spec.mebp_lr, mezo_eps=spec.mezo_eps, seed=spec.seed,
        quant=spec.quant, group_size=spec.group_size, compute_dtype=spec.compute_dtype,
        eval_every=spec.mezo_eval_every if mezo else spec.mebp_eval_every,
        knobs=EngineKnobs(threads=spec.threads))
    metrics = work_dir / f"{method}-metrics.jsonl"
    log(f"convergence: {method}, {config.steps} steps, {config.optimizer} lr {config.lr:g}")
    with track_memory() as memory:
        train(config, model_dir=model_dir, data=Path(corpus["train"]),
              validation_data=Path(corpus["validation"]), out=work_dir / f"{method}-adapter",
              memory=memory, metrics_path=metrics, on_step=_print_progress)
    return read_curve(metrics, initial_val_loss)


def _print_progress(metrics) -> None:
    if metrics.val_loss is not None:
        log(f"  step {metrics.step}: val_loss {metrics.val_loss:.4f}")


def measure_initial_loss(spec: ConvergenceSpec, model_dir: Path, validation: Path) -> float:
    """The validation loss at the shared init (LoRA B = 0: the base model's loss)."""
    from mebp_core.engine.evaluate import evaluate_dataset

    return evaluate_dataset(model_dir, validation, compute_dtype=spec.compute_dtype,
                            seq_len=spec.seq_len)["loss"]


def run_convergence(spec: ConvergenceSpec, work_dir: Path, png: Path | None = None) -> dict:
    """Build the corpus, train mezo then mebp, compare, plot; the report as a dict."""
    import torch

    from mebp_core.store.resolve import resolve_model

    if spec.threads:
        torch.set_num_threads(spec.threads)
    work_dir.mkdir(parents=True, exist_ok=True)
    corpus = write_docstring_corpus(work_dir / "corpus",
                                    validation_fraction=spec.validation_fraction,
                                    validation_chars=spec.validation_chars,
                                    max_files=spec.max_corpus_files)
    model_dir = resolve_model(spec.model, quant=spec.quant, group_size=spec.group_size)
    initial = measure_initial_loss(spec, model_dir, Path(corpus["validation"]))
    curves = {method: train_curve(spec, method, model_dir=model_dir, corpus=corpus,
                                  work_dir=work_dir, initial_val_loss=initial)
              for method in ("mezo", "mebp")}
    comparison = compare_curves(curves["mebp"], curves["mezo"])
    png = png or work_dir / "convergence.png"
    plot_curves(curves, comparison, png, title=f"{spec.model}, stdlib docstrings, "
                f"seq {spec.seq_len}")
    return {"mode": "convergence", "spec": asdict(spec), "machine": machine_info(),
            "corpus": corpus, "initial_val_loss": initial,
            "curves": {method: [asdict(point) for point in curve]
                       for method, curve in curves.items()},
            "comparison": comparison, "png": str(png)}


def plot_curves(curves: dict[str, list[CurvePoint]], comparison: dict, png: Path, *,
                title: str) -> Path:
    """Validation loss against steps (left) and against wall-clock seconds (right)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    for method, curve in curves.items():
        by_step.plot([p.step for p in curve], [p.val_loss for p in curve], marker=".",
                     label=method)
        by_time.plot([p.wall_s for p in curve], [p.val_loss for p in curve], marker=".",
                     label=method)
    for axis, xlabel in ((by_step, "optimizer steps"), (by_time, "training wall-clock (s)")):
        axis.axhline(comparison["target_val_loss"], color="gray", linestyle=":",
                     label="mezo's final validation loss")
        axis.set_xlabel(xlabel)
        axis.set_ylabel("validation loss (nats/token)")
        axis.grid(alpha=0.3)
        axis.legend()
    if comparison["mebp_wall_s_at_target"] is not None:
        by_time.axvline(comparison["mebp_wall_s_at_target"], color="gray", linestyle="--")
    speedup = comparison["wall_clock_speedup"]
    figure.suptitle(title + ("" if speedup is None else
                             f": mebp reaches it {speedup:.1f}x sooner in wall-clock"))
    figure.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png)
    plt.close(figure)
    return png


def format_summary(report: dict) -> str:
    comparison, spec = report["comparison"], report["spec"]
    lines = [f"corpus: {report['corpus']['train_docstrings']} train / "
             f"{report['corpus']['validation_docstrings']} validation docstrings "
             f"({report['corpus']['validation_chars']} validation chars)",
             f"initial validation loss {report['initial_val_loss']:.4f}",
             f"mezo: {comparison['mezo_steps']} steps (sgd lr {spec['mezo_lr']:g}, eps "
             f"{spec['mezo_eps']:g}) -> val loss {comparison['target_val_loss']:.4f} after "
             f"{comparison['mezo_wall_s']:.1f} s"]
    if comparison["mebp_step_at_target"] is None:
        lines.append(f"mebp ({spec['mebp_optimizer']} lr {spec['mebp_lr']:g}) did not reach "
                     f"it in {spec['mebp_steps']} steps: target not met")
    else:
        lines.append(f"mebp ({spec['mebp_optimizer']} lr {spec['mebp_lr']:g}) reaches it at "
                     f"step {comparison['mebp_step_at_target']} after "
                     f"{comparison['mebp_wall_s_at_target']:.1f} s: "
                     f"{comparison['wall_clock_speedup']:.1f}x sooner in wall-clock, "
                     f"{comparison['step_speedup']:.0f}x fewer steps (target >= "
                     f"{comparison['target_speedup']:g}x: "
                     f"{'met' if comparison['met'] else 'not met'})")
    lines.append(f"plot: {report['png']}")
    return "\n".join(lines)
