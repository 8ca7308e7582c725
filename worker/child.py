"""The engine process of one job: ``python -m worker.child JOB_DIR``, run inside the job's
memory cap. It never touches the database or Redis (their clients would count against the
budget); it reads ``request.json`` and writes ``metrics.jsonl``, ``adapter/`` and, last,
``result.json``. A kill by the kernel leaves no result: the worker reads the cgroup then.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from mebp_core.config import TrainConfig
from mebp_core.engine.memory import MB, MemorySampler
from mebp_core.engine.stop import StopOnSignals
from mebp_core.errors import MebpError

REQUEST, RESULT, METRICS = "request.json", "result.json", "metrics.jsonl"
ADAPTER, CHECKPOINT = "adapter", "checkpoint"
ALLOCATION_FAILURES = ("can't allocate memory", "not enough memory", "out of memory")


def run(job_dir: Path) -> dict:
    from mebp_core.engine.train import train

    request = json.loads((job_dir / REQUEST).read_text())
    config = TrainConfig.model_validate(request["config"])
    with MemorySampler() as sampler, StopOnSignals() as stop:
        validation = request.get("validation_data")
        result = train(config, model_dir=Path(request["model_dir"]),
                       data=Path(request["data"]), out=job_dir / ADAPTER, sampler=sampler,
                       validation_data=None if validation is None else Path(validation),
                       metrics_path=job_dir / METRICS, checkpoint_dir=job_dir / CHECKPOINT,
                       base_model_name=request["model"], stop_requested=stop.is_set)
    return {"status": "cancelled" if result.interrupted else "succeeded",
            "steps": result.steps, "final_loss": result.final_loss,
            "peak_anon_mb": result.peak_anon_mb, "footprint_mb": result.footprint_mb}


def read_peak_rss_bytes() -> int:
    """The kernel's high-water mark of this process's resident memory (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def write_result(job_dir: Path, result: dict) -> None:
    staging = job_dir / f".{RESULT}.tmp"
    staging.write_text(json.dumps(result))
    os.replace(staging, job_dir / RESULT)


def main(argv: list[str]) -> int:
    job_dir = Path(argv[0])
    try:
        result = run(job_dir)
    except MebpError as exc:
        result = {"status": "failed", "code": "invalid_input", "message": str(exc)}
    except MemoryError:
        result = {"status": "failed", "code": "memory_budget_exceeded",
                  "message": "an allocation failed under the memory limit",
                  "peak_rss_mb": read_peak_rss_bytes() / MB}
    except RuntimeError as exc:
        traceback.print_exc()
        if not any(text in str(exc).lower() for text in ALLOCATION_FAILURES):
            raise
        result = {"status": "failed", "code": "memory_budget_exceeded",
                  "message": f"an allocation failed under the memory limit: {exc}",
                  "peak_rss_mb": read_peak_rss_bytes() / MB}
    write_result(job_dir, result)
    return 0 if result["status"] != "failed" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
