"""``mebp bench --plan-check``: run each Pareto configuration the planner predicts for one
method (MeBP, MeZO or plain backprop) and print predicted against measured peak memory and
step time.

Every configuration runs in a fresh worker process, one at a time (the machine is shared:
nothing else of ours runs meanwhile). Optionally transformers + PEFT runs once per model and
sequence length, so the front's fastest end can be quoted as a ratio to it.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mebp_core.bench.side_by_side import preset_hf_dir, run_worker, worker_argv
from mebp_core.cache import default_cache_dir
from mebp_core.config import EngineKnobs, TrainConfig
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.calibration import calibration_path, load_calibration
from mebp_core.plan.correction import record_run
from mebp_core.plan.methods import method_config
from mebp_core.plan.on_host import plan_on_host
from mebp_core.plan.workload import matmul_dtype_of
from mebp_core.store.preset_configs import PRESET_PREFIX
from mebp_core.units import MB

MEMORY_TOLERANCE = 0.15
TIME_TOLERANCE = 0.25


@dataclass(frozen=True)
class PlanCheckSpec:
    models: tuple[str, ...]
    seq_lens: tuple[int, ...]
    method: str = "mebp"
    steps: int = 3
    compute_dtype: str = "float32"
    quant: str = "int4"
    group_size: int = 64
    threads: int | None = None
    max_configs: int | None = None  # per model and length, spread over the front
    with_peft: bool = False
    seed: int = 0
    learn: bool = False  # correct each prediction by the runs measured before it


def run_plan_check(spec: PlanCheckSpec) -> dict:
    """With ``learn``, in a private copy of this host's calibration, removed afterwards."""
    if not spec.learn:
        return _run_plan_check(spec, default_cache_dir())
    cache = _private_calibration(spec.threads)
    try:
        return _run_plan_check(spec, cache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _run_plan_check(spec: PlanCheckSpec, cache: Path) -> dict:
    from mebp_core.store.resolve import resolve_model

    rows, baselines, calibration = [], [], None
    for model in spec.models:
        packed = resolve_model(model, quant=spec.quant, group_size=spec.group_size)
        arch = load_architecture(model)
        for seq_len in spec.seq_lens:
            config = method_config(TrainConfig(
                seq_len=seq_len, compute_dtype=spec.compute_dtype, quant=spec.quant,
                group_size=spec.group_size, knobs=EngineKnobs(threads=spec.threads)), spec.method)
            plan = plan_on_host(arch, config, cache_dir=cache)
            calibration = plan.calibration
            for entry in _spread(plan.pareto, spec.max_configs):
                # with --learn, predicted with every run measured so far
                prediction = plan_on_host(arch, config, candidates=[entry.knobs],
                                          cache_dir=cache).entries[0].prediction
                knobs = entry.knobs.model_dump(mode="json", exclude={"threads"})
                options = ["--seq-len", str(seq_len), "--steps", str(spec.steps), "--dtype",
                           spec.compute_dtype, "--seed", str(spec.seed),
                           "--knobs", json.dumps(knobs)]
                if spec.threads:
                    options += ["--threads", str(spec.threads)]
                print(f"{model} seq {seq_len}: {entry.id}", file=sys.stderr, flush=True)
                measured = run_worker(worker_argv(spec.method, packed, *options))
                matmul_dtype = matmul_dtype_of(plan.workload, entry.knobs)
                rows.append(_row(model, seq_len, spec.method, entry.id, matmul_dtype,
                                 prediction, measured))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                if spec.learn:
                    # the time-corrections file records against the calibration's own stamp
                    record_run(calibration_path(cache, spec.threads),
                               load_calibration(cache, spec.threads).measured_at,
                               matmul_dtype=matmul_dtype,
                               modelled_s=prediction.modelled_step_time_s,
                               measured_s=measured["s_per_step"], label=entry.id,
                               modelled_parts=prediction.modelled_time,
                               measured_parts={"decompress": measured["decompress_s_median"]})
            if spec.with_peft and not model.startswith(PRESET_PREFIX):
                print(f"{model}: --with-peft needs a preset (a Hugging Face copy is generated "
                      "from it); skipped", file=sys.stderr)
            elif spec.with_peft:
                hf = preset_hf_dir(model.removeprefix(PRESET_PREFIX),
                                   default_cache_dir() / "hf-presets")
                options = ["--seq-len", str(seq_len), "--steps", str(spec.steps), "--dtype",
                           spec.compute_dtype]
                peft = run_worker(worker_argv("peft", hf, *options))
                baselines.append({"model": model, "seq_len": seq_len,
                                  "s_per_step": peft["s_per_step"],
                                  "peak_mb": peft["peak_mb"]})
    report = {"method": spec.method, "rows": rows, "peft": baselines,
              "calibration": calibration,
              "compute_dtype": spec.compute_dtype, "quant": spec.quant, "learn": spec.learn,
              "memory_within": _share(rows, "memory_error", MEMORY_TOLERANCE),
              "time_within": _share(rows, "time_error", TIME_TOLERANCE)}
    if spec.learn:  # after one corrective run
        report["time_within_corrected"] = _share(rows[1:], "time_error", TIME_TOLERANCE)
        report["time_within_corrected_one_factor"] = _share(rows[1:], "time_error_one_factor",
                                                            TIME_TOLERANCE)
    return report


def _private_calibration(threads: int | None) -> Path:
    """A temporary cache holding a copy of this host's calibration and no correction."""
    load_calibration(default_cache_dir(), threads)  # measured first if missing
    cache = Path(tempfile.mkdtemp(prefix="mebp-plan-check-"))
    target = calibration_path(cache, threads)
    target.parent.mkdir(parents=True)
    shutil.copyfile(calibration_path(default_cache_dir(), threads), target)
    return cache


def _spread(front: list, limit: int | None) -> list:
    """At most ``limit`` entries of the front, always both ends, evenly between."""
    if limit is None or len(front) <= limit:
        return front
    if limit == 1:
        return front[-1:]
    picks = {round(i * (len(front) - 1) / (limit - 1)) for i in range(limit)}
    return [front[i] for i in sorted(picks)]


def _row(model: str, seq_len: int, method: str, config: str, matmul_dtype: str, prediction,
         measured: dict) -> dict:
    predicted_mb = prediction.peak_bytes / MB
    predicted_s = prediction.step_time_s
    # what the prior alone (one factor for every part) would have predicted
    prior = 1.0 if prediction.correction is None else prediction.correction.factor
    return {"model": model, "seq_len": seq_len, "method": method, "config": config,
            "matmul_dtype": matmul_dtype,
            "time_correction": round(prediction.time_factor, 4),
            "modelled_time_s": {k: round(v, 4) for k, v in prediction.modelled_time.items()},
            # the engine's own clock on its dequantization, beside the modelled part
            "measured_decompress_s": measured.get("decompress_s_median"),
            # what it dequantized, beside the model's count (the same on any host)
            "decompressed_params": measured.get("decompressed_params"),
            "modelled_decompressed_params": prediction.device_work.tile_params
            + prediction.device_work.whole_params,
            "time_error_one_factor": prediction.modelled_step_time_s * prior
            / measured["s_per_step"] - 1,
            "predicted_peak_mb": round(predicted_mb, 1),
            "measured_peak_mb": round(measured["peak_mb"], 1),  # the kernel's figure
            "memory_error": measured["peak_mb"] and predicted_mb / measured["peak_mb"] - 1,
            "predicted_s": round(predicted_s, 3), "measured_s": round(measured["s_per_step"], 3),
            "time_error": predicted_s / measured["s_per_step"] - 1}


def _share(rows: list[dict], key: str, tolerance: float) -> str:
    inside = sum(abs(r[key]) <= tolerance for r in rows)
    return f"{inside}/{len(rows)}"


def format_plan_check(report: dict) -> str:
    lines = [f"method {report['method']}",
             f"{'model':<22} {'seq':>5} {'configuration':<46} {'MB pred':>8} {'MB meas':>8} "
             f"{'err':>6} {'s pred':>7} {'s meas':>7} {'err':>6}"]
    for r in report["rows"]:
        lines.append(f"{r['model']:<22} {r['seq_len']:>5} {r['config']:<46} "
                     f"{r['predicted_peak_mb']:>8.0f} {r['measured_peak_mb']:>8.0f} "
                     f"{r['memory_error']:>+6.0%} {r['predicted_s']:>7.2f} "
                     f"{r['measured_s']:>7.2f} {r['time_error']:>+6.0%}")
    lines.append(f"memory within {MEMORY_TOLERANCE:.0%}: {report['memory_within']}; "
                 f"time within {TIME_TOLERANCE:.0%}: {report['time_within']}")
    if report.get("learn"):
        lines.append(f"time within {TIME_TOLERANCE:.0%} after the first (corrective) run: "
                     f"{report['time_within_corrected']} (one factor for every part: "
                     f"{report['time_within_corrected_one_factor']})")
    for base in report["peft"]:
        same = [r for r in report["rows"]
                if r["model"] == base["model"] and r["seq_len"] == base["seq_len"]]
        if not same:
            continue
        fastest = min(same, key=lambda r: r["measured_s"])
        lines.append(f"{base['model']} seq {base['seq_len']}: transformers + PEFT "
                     f"{base['s_per_step']:.2f} s/step, {base['peak_mb']:.0f} MB; fastest "
                     f"front config {fastest['measured_s'] / base['s_per_step']:.2f}x its time")
    return "\n".join(lines)
