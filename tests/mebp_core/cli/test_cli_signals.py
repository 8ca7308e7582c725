"""SIGTERM and Ctrl-C stop `mebp train` after the current step with a checkpoint to resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_a_checkpoint_and_resume_continues(signal_number, tmp_path, warm_cache):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": f"line {i} of a small corpus"}) + "\n"
                            for i in range(20)))
    env = {**os.environ, "MEBP_CACHE_DIR": str(warm_cache), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "mebp_core.cli", "train", "--model", "preset:tiny",
               "--data", str(data), "--out", str(tmp_path / "adapter"), "--seq-len", "32",
               "--metrics", str(tmp_path / "m.jsonl")]
    process = subprocess.Popen([*command, "--steps", "100000"], stderr=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env=env)
    for line in process.stderr:  # wait until training has really started
        if line.startswith("step 2:"):
            break
    process.send_signal(signal_number)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal_number, stderr
    assert "Traceback" not in stderr and "--resume" in stderr
    stopped_at = json.loads(stdout)["steps"]
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "adapter.checkpoint" / "state.json").is_file()

    resumed = subprocess.run([*command, "--steps", str(stopped_at + 2), "--resume"],
                             capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    steps = [json.loads(line)["step"] for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert steps == list(range(1, stopped_at + 3))
