"""The files between a worker and its engine child are read through their models: what one
side writes the other reads back, and a file of another shape is an error naming it (in the
engine's own process, where a worker reads it from the engine's log)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mebp_core.config import EngineKnobs, TrainConfig
from worker.engine_files import (
    REQUEST,
    RESULT,
    EngineFailed,
    EngineFileError,
    EngineFinished,
    EngineRequest,
    read_request,
    read_result,
    write_request,
    write_result,
)

REQUEST_FIELDS = {"config": TrainConfig(steps=3, knobs=EngineKnobs(threads=2)).model_dump(
    mode="json"), "model": "preset:tiny", "model_dir": "/cache/tiny", "data": "/d/train.jsonl"}


def test_a_request_and_a_result_read_back_as_written(tmp_path):
    request = EngineRequest.model_validate({**REQUEST_FIELDS, "resume": True})
    write_request(tmp_path, request)
    assert read_request(tmp_path) == request
    assert read_request(tmp_path).config.knobs.threads == 2
    for result in (EngineFinished(status="cancelled", steps=2, final_loss=None, peak_mb=1.5,
                                  peak_anon_mb=1.0, footprint_mb=1.2, memory_method="cgroup"),
                   EngineFailed(code="invalid_input", message="line 3: not JSON")):
        write_result(tmp_path, result)
        assert read_result(tmp_path) == result
    (tmp_path / RESULT).unlink()
    assert read_result(tmp_path) is None  # a killed engine leaves none


@pytest.mark.parametrize(("text", "named"), [
    ("{not json", "json_invalid"),
    (json.dumps({**{k: v for k, v in REQUEST_FIELDS.items() if k != "model_dir"},
                 "model_path": "/cache/tiny"}), "model_path"),  # a renamed key
    (json.dumps({**REQUEST_FIELDS, "config": {**REQUEST_FIELDS["config"], "steps": "3x"}}),
     "config.steps"),
])
def test_a_malformed_request_is_an_error_naming_the_file_and_the_field(tmp_path, text, named):
    (tmp_path / REQUEST).write_text(text)
    with pytest.raises(EngineFileError) as caught:
        read_request(tmp_path)
    assert str(tmp_path / REQUEST) in str(caught.value) and named in str(caught.value)


def test_the_engine_given_a_malformed_request_names_the_file_and_writes_no_result(tmp_path):
    (tmp_path / REQUEST).write_text(json.dumps({**REQUEST_FIELDS, "model_dir": None}))
    engine = subprocess.run([sys.executable, "-m", "worker.child", str(tmp_path)],
                            capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[2])
    assert engine.returncode != 0
    assert f"EngineFileError: {tmp_path / REQUEST}: not an engine request" in engine.stderr
    assert "model_dir" in engine.stderr and not (tmp_path / RESULT).exists()


def test_a_malformed_result_is_an_error_naming_the_file(tmp_path):
    (tmp_path / RESULT).write_text(json.dumps({"status": "succeeded", "steps": 3}))
    with pytest.raises(EngineFileError, match=f"{tmp_path / RESULT}: not an engine result"):
        read_result(tmp_path)
