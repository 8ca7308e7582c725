from __future__ import annotations

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
