"""mebp, mezo, backprop and transformers + PEFT side by side on one model, each in a fresh
process so that their memory peaks never mix.

Per method: whole-process peak anonymous memory, the footprint above the post-import
baseline, the median s/step after a warm-up step, and that time as a ratio to the
transformers + PEFT baseline of the same run. With ``repeats`` > 1 every method runs that many
times, interleaved, and each ratio is the median of per-repeat ratios (a noisy machine then
slows every row alike). Optionally the cosine between MeZO's gradient estimate and the exact
LoRA gradient, over several seeds.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from mebp_core.store.preset_configs import PRESET_PREFIX

BASELINE = "peft"
METHODS = ("mebp", "mezo", "backprop", BASELINE)
LABELS = {"mebp": "mebp", "mezo": "mezo", "backprop": "backprop",
          BASELINE: "transformers+PEFT bf16"}


class BenchError(RuntimeError):
    """A measurement child failed or printed no result."""


@dataclass(frozen=True)
class SideBySideSpec:
    model: str = "preset:qwen2.5-0.5b"
    seq_len: int = 256
    steps: int = 3
    methods: tuple[str, ...] = METHODS
    threads: int | None = None
    compute_dtype: str = "bfloat16"
    quant: str = "int4"
    group_size: int = 64
    repeats: int = 1
    cosine_seeds: int = 5
    seed: int = 0


def worker_argv(kind: str, model: Path | None, *options: str) -> list[str]:
    """The measurement child's command line (``mebp_core.bench.worker``)."""
    return [sys.executable, "-m", "mebp_core.bench.worker", kind,
            *([] if model is None else ["--model", str(model)]), *options]


def parse_result(stdout: str) -> dict | None:
    """The child's result: its last JSON line, or None if it printed none."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def run_worker(argv: list[str]) -> dict:
    """Run one child; its JSON result line plus its exit code and wall time."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    result = parse_result(proc.stdout)
    if proc.returncode != 0 or result is None:
        raise BenchError(f"{' '.join(argv[2:5])} failed (exit {proc.returncode}): "
                         f"{proc.stderr[-1500:]}")
    result.update(exit_code=proc.returncode, wall_s=time.perf_counter() - start)
    return result


def resolve_models(spec: SideBySideSpec, needs_hf: bool) -> tuple[Path, Path | None]:
    """The packed dir for the engine and a Hugging Face dir for the baseline (None if the
    model is already packed: there are no HF weights to load)."""
    from mebp_core.cache import default_cache_dir
    from mebp_core.store.format import STORE_FILENAME
    from mebp_core.store.resolve import resolve_model

    packed = resolve_model(spec.model, quant=spec.quant, group_size=spec.group_size)
    if not needs_hf:
        return packed, None
    if spec.model.startswith(PRESET_PREFIX):
        return packed, preset_hf_dir(spec.model.removeprefix(PRESET_PREFIX),
                                     default_cache_dir() / "hf-presets")
    hf = Path(spec.model)
    return packed, None if (hf / STORE_FILENAME).is_file() else hf


def preset_hf_dir(name: str, cache: Path) -> Path:
    """The preset written once as a Hugging Face dir (its config's dtype), then reused."""
    from mebp_core.store.presets import save_preset_as_hf

    out = cache / name
    if (out / "config.json").is_file():
        return out
    tmp = cache / f".{name}.tmp{os.getpid()}"
    save_preset_as_hf(name, tmp)
    tmp.rename(out)
    return out


def method_options(spec: SideBySideSpec) -> list[str]:
    options = ["--seq-len", str(spec.seq_len), "--steps", str(spec.steps),
               "--dtype", spec.compute_dtype, "--seed", str(spec.seed)]
    return options + (["--threads", str(spec.threads)] if spec.threads else [])


def measure_methods(spec: SideBySideSpec, packed: Path, hf: Path | None) -> dict[str, list]:
    """method -> one result per repeat, the methods interleaved within each repeat."""
    runs: dict[str, list[dict]] = {method: [] for method in spec.methods}
    for repeat in range(spec.repeats):
        for method in spec.methods:
            model = hf if method == BASELINE else packed
            if model is None:
                continue
            log(f"repeat {repeat + 1}/{spec.repeats}: {LABELS[method]}")
            runs[method].append(run_worker(worker_argv(method, model, *method_options(spec))))
    return {method: results for method, results in runs.items() if results}


def summarize_row(method: str, runs: list[dict]) -> dict:
    """Medians over the repeats of the per-run figures."""
    def median(key: str) -> float:
        return statistics.median(run[key] for run in runs)

    return {"method": method, "label": LABELS[method], "repeats": len(runs),
            "peak_mb": median("peak_mb"), "footprint_mb": median("footprint_mb"),
            "post_import_mb": median("post_import_mb"), "peak_anon_mb": median("peak_anon_mb"),
            "s_per_step": median("s_per_step"),
            "s_per_step_range": [min(r["s_per_step"] for r in runs),
                                 max(r["s_per_step"] for r in runs)],
            "threads": runs[0].get("threads"), "runs": runs}


def per_repeat_ratio(numerator: list[dict], denominator: list[dict]) -> float:
    """Median over repeats of numerator s/step over the same repeat's denominator s/step."""
    return statistics.median(a["s_per_step"] / b["s_per_step"]
                             for a, b in zip(numerator, denominator, strict=True))


def add_ratios(rows: list[dict]) -> dict:
    """Each row's ``time_ratio_to_baseline``; returns the mebp/mezo and mebp/backprop ratios."""
    by_method = {row["method"]: row for row in rows}
    baseline = by_method.get(BASELINE)
    for row in rows:
        row["time_ratio_to_baseline"] = (per_repeat_ratio(row["runs"], baseline["runs"])
                                         if baseline else None)
    ratios = {}
    for other in ("mezo", "backprop"):
        if "mebp" in by_method and other in by_method:
            ratios[f"mebp_over_{other}_s_per_step"] = per_repeat_ratio(
                by_method["mebp"]["runs"], by_method[other]["runs"])
    return ratios


def measure_cosine(spec: SideBySideSpec, packed: Path) -> dict | None:
    if spec.cosine_seeds <= 0:
        return None
    log(f"cosine: MeZO estimate vs exact gradient, {spec.cosine_seeds} seeds")
    options = ["--seq-len", str(spec.seq_len), "--dtype", "float32", "--seed", str(spec.seed),
               "--seeds", str(spec.cosine_seeds)]
    return run_worker(worker_argv("cosine", packed, *options,
                                  *(["--threads", str(spec.threads)] if spec.threads else [])))


def run_side_by_side(spec: SideBySideSpec) -> dict:
    packed, hf = resolve_models(spec, needs_hf=BASELINE in spec.methods)
    rows = [summarize_row(method, runs)
            for method, runs in measure_methods(spec, packed, hf).items()]
    ratios = add_ratios(rows)
    return {"mode": "side_by_side", "spec": asdict(spec), "machine": machine_info(),
            "packed_model": str(packed), "hf_model": str(hf) if hf else None,
            "rows": rows, "ratios": ratios, "cosine": measure_cosine(spec, packed)}


def format_table(report: dict) -> str:
    spec = report["spec"]
    lines = [f"model {spec['model']}  seq {spec['seq_len']}  steps {spec['steps']} (first is "
             f"warm-up)  {spec['quant']} g{spec['group_size']}  {spec['compute_dtype']}  "
             f"threads {spec['threads'] or 'default'}  repeats {spec['repeats']}", "",
             "| method | peak MB (anon+shmem) | footprint MB | s/step | vs transformers+PEFT |",
             "|---|---:|---:|---:|---:|"]
    for row in report["rows"]:
        ratio = row["time_ratio_to_baseline"]
        lines.append(f"| {row['label']} | {row['peak_mb']:.0f} | {row['footprint_mb']:.0f}"
                     f" | {row['s_per_step']:.3f} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}x'} |")
    if report["ratios"]:
        lines.append("")
    for name, value in report["ratios"].items():
        lines.append(f"{name.replace('_', ' ')}: {value:.2f}x")
    cosine = report.get("cosine")
    if cosine:
        lines.append(f"\nMeZO estimate vs exact LoRA gradient, cosine over {len(cosine['cosines'])}"
                     f" seeds: mean {cosine['cosine_mean']:.5f} (std {cosine['cosine_std']:.5f};"
                     f" sqrt(2/(pi d)) = {cosine['cosine_expected']:.5f} for d = "
                     f"{cosine['lora_parameters']})")
    return "\n".join(lines)


def machine_info() -> dict:
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cpus": os.cpu_count(),
            "platform": platform.platform(), "python": platform.python_version(),
            "loadavg_1m": os.getloadavg()[0], "commit": git_commit()}


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).parent, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
