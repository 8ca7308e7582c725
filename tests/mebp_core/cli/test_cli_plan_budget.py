"""`mebp train --plan-budget-mb`: the planner picks the knobs, or the run is refused with the
smallest budget that would fit."""

from __future__ import annotations

from test_cli_train_eval import run_mebp, tiny_hf, token_rows, write_jsonl  # noqa: F401


def test_a_roomy_budget_trains_with_the_fastest_configuration(tiny_hf, tmp_path,  # noqa: F811
                                                              seed_calibration):
    cache = seed_calibration(tmp_path / "cache")
    data = write_jsonl(tmp_path / "train.jsonl", token_rows(seed=3))
    done = run_mebp("train", "--model", tiny_hf, "--data", data, "--out", tmp_path / "a",
                    "--steps", "2", "--seq-len", "16", "--plan-budget-mb", "4000", cache=cache)
    assert done.returncode == 0, done.stderr
    assert "planner: resident-nockpt" in done.stderr  # everything kept: the fastest
    assert (tmp_path / "a" / "adapter_model.safetensors").is_file()


def test_a_budget_nothing_fits_is_refused_with_the_smallest_that_would(tiny_hf,  # noqa: F811
                                                                     tmp_path,
                                                                     seed_calibration):
    cache = seed_calibration(tmp_path / "cache")
    data = write_jsonl(tmp_path / "train.jsonl", token_rows(seed=4))
    done = run_mebp("train", "--model", tiny_hf, "--data", data, "--out", tmp_path / "b",
                    "--steps", "2", "--seq-len", "16", "--plan-budget-mb", "100", cache=cache)
    assert done.returncode == 2
    assert "no configuration fits 100 MB" in done.stderr
    assert "the smallest budget that fits is" in done.stderr and "runtime dominates" in \
        done.stderr
    assert not (tmp_path / "b").exists()


def test_knob_flags_are_checked_before_anything_runs(tiny_hf, tmp_path,  # noqa: F811
                                                     seed_calibration):
    cache = seed_calibration(tmp_path / "cache")
    data = write_jsonl(tmp_path / "train.jsonl", token_rows(seed=5))
    common = ("train", "--model", tiny_hf, "--data", data, "--out", tmp_path / "c")
    for flags, message in [
        (("--method", "mezo", "--optimizer", "adamw", "--plan-budget-mb", "900"),
         "method mezo trains with sgd only"),
        (("--checkpoint-blocks", "0"),
         "--checkpoint-blocks: Input should be greater than or equal to 1, or Input should "
         "be 'none'"),
        (("--checkpoint-blocks", "some"), "expected a number or 'none', got 'some'"),
        (("--mlp-chunk-tokens", "0"), "--mlp-chunk-tokens: Input should be greater than or "
         "equal to 1"),
        (("--loss-vocab-tile-bytes", "lots"), "not a size: 'lots'"),
        (("--plan-budget-mb", "-3"), "must be a positive number"),
        (("--resident-weight-bytes", "10M"), "needs frozen_weights 'resident'"),
    ]:
        done = run_mebp(*common, *flags, cache=cache)
        assert done.returncode == 2, flags
        assert message in done.stderr, (flags, done.stderr)
    assert not (tmp_path / "c").exists()


def test_inside_a_memory_cap_the_calibration_is_not_measured(tiny_hf, tmp_path):  # noqa: F811
    """Measuring would run torch inside the cap and count against it: refused, with what to
    run instead; nothing is written."""
    import os
    import subprocess
    import sys
    import uuid

    from worker.memory_cap import PROCS_ENV, open_memory_cap

    cap, _ = open_memory_cap("auto", f"test-{uuid.uuid4().hex[:8]}", 2048 << 20)
    try:
        procs = cap.child_env()[PROCS_ENV]
        data = write_jsonl(tmp_path / "train.jsonl", token_rows(seed=6))
        cache = tmp_path / "empty-cache"
        done = subprocess.run(
            ["/bin/sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", sys.executable, "-m",
             "mebp_core.cli", "train", "--model", str(tiny_hf), "--data", str(data), "--out",
             str(tmp_path / "d"), "--steps", "1", "--seq-len", "16", "--plan-budget-mb", "900"],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "MEBP_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"})
    finally:
        cap.close()
    assert done.returncode == 2, done.stderr
    assert "memory cap of 2048 MB" in done.stderr and "mebp plan --model" in done.stderr
    assert not (tmp_path / "d").exists() and not (cache / "calibration").exists()
