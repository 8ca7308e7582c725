"""Markdown tables and the issue-2 target checks for ``engine_memory.py`` results."""

from __future__ import annotations

TARGET_PRESET = "qwen2.5-0.5b"
TARGET_SEQ_LEN = 256
TARGET_CAP_MB = 320
TARGETS = {  # issue 2: qwen2.5-0.5b, seq 256, batch 1, LoRA r8 x7, int4 g64, SGD
    "footprint_mb": 100.0,
    "peak_mb": 300.0,  # anonymous + shared: what the kernel charges
    "step_time_ratio_vs_peft": 1.5,
    "decompress_share": 0.15,
}


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def step_ratio(row: dict) -> float | None:
    """mebp/HF step time: the median of the per-repeat ratios (each against the same repeat's
    baseline) when the row has them, else the ratio of the two medians."""
    if row.get("time_ratios"):
        return row["time_ratio"]
    mebp, peft = row.get("mebp", {}), row.get("peft", {})
    if "s_per_step" in mebp and "s_per_step" in peft:
        return mebp["s_per_step"] / peft["s_per_step"]
    return None


def _range(run: dict) -> str:
    lo_hi = run.get("s_per_step_range")
    if not lo_hi or run.get("repeats", 1) < 2:
        return ""
    return f" ({lo_hi[0]:.2f}-{lo_hi[1]:.2f})"


def _ratios(row: dict) -> str:
    ratios = row.get("time_ratios") or []
    if len(ratios) < 2:
        return ""
    return " (" + ", ".join(f"{r:.2f}" for r in ratios) + ")"


def _cpu_use(run: dict) -> float | None:
    """Cores the child kept busy on average: ~threads when alone, less when contended."""
    return run["cpu_s"] / run["wall_s"] if run.get("wall_s") else None


def mebp_table(report: dict) -> list[str]:
    lines = [
        "| preset | seq | config | peak MB (anon+shmem) | post-import MB | footprint MB "
        "| above bare torch MB | ckpt MB | s/step | decompress s | decompress % "
        "| HF+PEFT s/step | HF+PEFT peak MB | mebp/HF time "
        "| peak RSS incl. files mebp / HF MB | cores busy mebp / HF |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        m, p = row["mebp"], row.get("peft", {})
        share = m.get("decompress_share")
        ckpt = _fmt(m.get("checkpoint_mb"), 1)
        if row.get("knobs", {}).get("checkpoint_storage") == "mmap":
            ckpt += " (file)"
        ratio = step_ratio(row)
        lines.append(
            f"| {row['preset']} | {row['seq_len']} | {row.get('config', 'default')} "
            f"| {_fmt(m.get('peak_mb'))} "
            f"| {_fmt(m.get('post_import_mb'))} | {_fmt(m.get('footprint_mb'))} "
            f"| {_fmt(m.get('above_bare_torch_mb'))} | {ckpt} "
            f"| {_fmt(m.get('s_per_step'), 2)}{_range(m)} "
            f"| {_fmt(m.get('decompress_s_median'), 2)} "
            f"| {_fmt(share * 100 if share is not None else None, 1)} "
            f"| {_fmt(p.get('s_per_step'), 2)}{_range(p)} | {_fmt(p.get('peak_mb'))} "
            f"| {_fmt(ratio, 2) + 'x' if ratio is not None else '-'}{_ratios(row)} "
            f"| {_fmt(m.get('peak_rss_mb'))} / {_fmt(p.get('peak_rss_mb'))} "
            f"| {_fmt(_cpu_use(m), 1)} / {_fmt(_cpu_use(p), 1)} |")
    return lines


def cgroup_table(report: dict) -> list[str]:
    lines = [
        "| preset | seq | config | cap MB | steps done | exit code | cgroup max usage MB "
        "| sampled peak anon+shmem / file MB | failcnt | oom kills | child peak MB | s/step |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        run = row.get("mebp_capped")
        if not run:
            continue
        cg = run.get("cgroup", {})
        lines.append(
            f"| {row['preset']} | {row['seq_len']} | {row.get('config', 'default')} "
            f"| {_fmt(cg.get('cap_mb'))} "
            f"| {run.get('steps_completed', 0)}/{row['steps']} | {run['exit_code']} "
            f"| {_fmt(cg.get('max_usage_mb'))} | {_fmt(cg.get('sampled_peak_charged_mb'))} / "
            f"{_fmt(cg.get('sampled_peak_file_mb'))} | {cg.get('failcnt', '-')} "
            f"| {cg.get('oom_kill', '-')} | {_fmt(run.get('peak_mb'))} "
            f"| {_fmt(run.get('s_per_step'), 2)} |")
    return lines


def check_targets(rows: list[dict], cap_mb: int | None) -> list[dict]:
    """Verdicts on the issue-2 targets, one set per config, from the qwen2.5-0.5b seq-256
    rows (if measured)."""
    checks = []
    for row in rows:
        if row["preset"] != TARGET_PRESET or row["seq_len"] != TARGET_SEQ_LEN:
            continue
        config = row.get("config", "default")
        m = row["mebp"]
        measured = {"footprint_mb": m.get("footprint_mb"), "peak_mb": m.get("peak_mb"),
                    "step_time_ratio_vs_peft": step_ratio(row),
                    "decompress_share": m.get("decompress_share")}
        checks += [{"config": config, "target": name, "limit": limit,
                    "measured": measured[name],
                    "met": None if measured[name] is None else measured[name] <= limit}
                   for name, limit in TARGETS.items()]
        capped = row.get("mebp_capped")
        if capped and cap_mb == TARGET_CAP_MB:
            done = capped["exit_code"] == 0 and capped.get("steps_completed") == row["steps"]
            checks.append({"config": config, "target": "completes_under_cgroup_cap_mb",
                           "limit": TARGET_CAP_MB, "measured": capped["exit_code"],
                           "met": done})
    return checks


def targets_table(report: dict) -> list[str]:
    lines = ["| target (qwen2.5-0.5b, seq 256) | config | limit | measured | met |",
             "|---|---|---:|---:|---|"]
    for c in report["targets"]:
        verdict = {True: "yes", False: "**no**", None: "not measured"}[c["met"]]
        measured = c["measured"]
        shown = f"{measured:.3g}" if isinstance(measured, float) else str(measured)
        if c["target"] == "completes_under_cgroup_cap_mb":
            shown = f"exit {measured}"
        lines.append(f"| {c['target']} | {c.get('config', 'default')} | {c['limit']} "
                     f"| {shown} | {verdict} |")
    return lines


def markdown_tables(report: dict, cap_mb: int | None) -> str:
    bare = report["bare_torch"].get("bare_torch_mb")
    threads = report.get("threads_used") or ["?"]
    parts = [f"Bare `import torch` RssAnon: {_fmt(bare)} MB. Torch threads per child: "
             f"{', '.join(map(str, threads))}"
             f"{'' if report.get('threads_requested') else ' (torch default)'}. "
             f"Repeats: {report.get('repeats', 1)}.", "", *mebp_table(report)]
    if cap_mb:
        parts += ["", *cgroup_table(report)]
    if report["targets"]:
        parts += ["", *targets_table(report)]
    return "\n".join(parts)
