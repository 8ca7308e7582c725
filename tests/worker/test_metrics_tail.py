from __future__ import annotations

from mebp_core.engine.metrics_file import keep_steps_through
from worker.metrics_tail import MetricsTail


def test_each_complete_line_is_read_once_and_a_partial_one_waits(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.read_new() == []  # not written yet
    path.write_bytes(b'{"step": 1}\n{"step": 2}\n{"ste')
    assert tail.read_new() == [{"step": 1}, {"step": 2}]
    with open(path, "ab") as file:
        file.write(b'p": 3}\n')
    assert tail.read_new() == [{"step": 3}]
    assert tail.read_new() == []


def test_a_resumed_run_keeps_the_lines_up_to_its_checkpoint_and_is_tailed_from_there(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4')  # killed mid-line
    keep_steps_through(path, 2)
    assert path.read_bytes() == b'{"step": 1}\n{"step": 2}\n'
    tail = MetricsTail(path, start_at_end=True)
    with open(path, "ab") as file:
        file.write(b'{"step": 3}\n')
    assert tail.read_new() == [{"step": 3}]
    keep_steps_through(path, 0)
    assert path.read_bytes() == b""
