"""The engine process of one job: ``python -m worker.child JOB_DIR``, run inside the job's
memory cap. It never touches the database or Redis (their clients would count against the
budget); it reads ``request.json`` and writes ``metrics.jsonl``, ``adapter/`` and, last,
``result.json`` (``worker.engine_files``). A kill by the kernel leaves no result: the worker
reads the cgroup then.

Its first acts, before any import that allocates: enter the cap, tie its life to the
worker's, and turn SIGTERM (a cancel) into "stop after this step". Started ahead of its job
(``--wait FD``, ``worker.warm_engine``), it imports what training needs and then reads the
job's directory and its horse's pid from the pipe FD; it writes its output to the job's
``engine.log`` from then on and dies with that horse. Forked from the worker's zygote
(``worker.engine_zygote``), it starts at ``serve`` with the imports done.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from mebp_core.engine.memory import track_memory
from mebp_core.engine.stop import StopOnSignals
from mebp_core.errors import MebpError, out_of_space
from mebp_core.proc import die_with_parent
from mebp_core.units import MB
from worker.memory_cap import join_from_env

if TYPE_CHECKING:  # imported once the cap is joined, as is everything that allocates
    from worker.engine_files import EngineFailed, EngineFinished

METRICS = "metrics.jsonl"
# the adapter trained, the resume checkpoint, and the adapters kept at checkpoint steps
ADAPTER, CHECKPOINT, KEPT = "adapter", "checkpoint", "checkpoints"
ALLOCATION_FAILURES = ("can't allocate memory", "not enough memory", "out of memory")
EXIT_STORAGE_FULL = 28  # ENOSPC: the result itself may not fit on the disk, so say it so
PARENT_ENV = "MEBP_ENGINE_PARENT_PID"
WAIT_FLAG = "--wait"
ENGINE_LOG = "engine.log"


def run(job_dir: Path, stop: StopOnSignals) -> EngineFinished:
    from mebp_core.engine.train import train
    from worker.engine_files import EngineFinished, read_request

    request = read_request(job_dir)
    with track_memory() as memory:
        result = train(request.config, model_dir=request.model_dir, data=request.data,
                       out=job_dir / ADAPTER, memory=memory,
                       validation_data=request.validation_data,
                       metrics_path=job_dir / METRICS, checkpoint_dir=job_dir / CHECKPOINT,
                       resume=request.resume, init_adapter=request.init_adapter,
                       kept_dir=job_dir / KEPT if request.keep_checkpoints else None,
                       stop_requested=stop.is_set)
    return EngineFinished(status="cancelled" if result.interrupted else "succeeded",
                          steps=result.steps, final_loss=result.final_loss,
                          peak_mb=result.peak_mb, peak_anon_mb=result.peak_anon_mb,
                          footprint_mb=result.footprint_mb, memory_method=result.memory_method)


def read_peak_rss_bytes() -> int:
    """The kernel's high-water mark of this process's resident memory (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def wait_for_job(control_fd: int) -> Path | None:
    """Import what training needs, then block until the horse sends the job (None: the
    pipe closed first, the worker is gone). From then on this process writes to the job's
    log and dies with the horse (a horse killed leaves no engine training on)."""
    import mebp_core.engine.train  # noqa: F401
    import worker.engine_files  # noqa: F401

    message = b""
    while message.count(b"\n") < 2:
        chunk = os.read(control_fd, 4096)
        if not chunk:
            return None
        message += chunk
    os.close(control_fd)
    job_dir, horse = message.decode().split("\n")[:2]
    log = os.open(Path(job_dir) / ENGINE_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for stream in (1, 2):
        os.dup2(log, stream)
    os.close(log)
    die_with(int(horse))
    # from now on it lives as long as its horse (which dies with the worker), not as long
    # as the process it was forked from, whose end must not end a job (0: no signal)
    die_with_parent(0)
    return Path(job_dir)


def die_with(pid: int) -> None:
    """Be killed when process ``pid`` (not this one's parent) ends."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:  # ended already
        os.kill(os.getpid(), signal.SIGKILL)

    def watch() -> None:
        select.select([pidfd], [], [])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="horse-watch").start()


def main(argv: list[str]) -> int:
    join_from_env()
    if PARENT_ENV in os.environ:  # a killed worker leaves no engine training on
        die_with_parent(signal.SIGKILL, int(os.environ[PARENT_ENV]))
    return serve(argv)


def serve(argv: list[str]) -> int:
    """Once in its cap and tied to its parent: run the job of ``JOB_DIR``, or of the job
    directory ``--wait FD`` reads; the exit code."""
    if argv[0] == WAIT_FLAG:
        job_dir = wait_for_job(int(argv[1]))
        if job_dir is None:
            return 0
    else:
        job_dir = Path(argv[0])
    try:
        with StopOnSignals() as stop:
            result = run(job_dir, stop)
    except Exception as exc:  # noqa: BLE001  what is not a known failure is re-raised
        if out_of_space(exc):
            print(f"mebp: storage full: {exc}", file=sys.stderr)
            return EXIT_STORAGE_FULL
        result = failure(exc)
    from worker.engine_files import write_result

    write_result(job_dir, result)
    return 0 if result.status != "failed" else 1


def failure(exc: Exception) -> EngineFailed:
    """The result of a run that failed in a way the user can act on; anything else (a bug)
    propagates with its traceback, and the worker reports the engine crashed."""
    from worker.engine_files import EngineFailed

    if isinstance(exc, MebpError):
        return EngineFailed(code=exc.code, message=str(exc))
    allocation = isinstance(exc, MemoryError) or (
        isinstance(exc, RuntimeError) and any(text in str(exc).lower()
                                              for text in ALLOCATION_FAILURES))
    if not allocation:
        raise exc
    traceback.print_exc()
    return EngineFailed(code="memory_budget_exceeded",
                        message=f"an allocation failed under the memory limit: {exc}",
                        peak_rss_mb=read_peak_rss_bytes() / MB)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # its files are closed and its result written: skip the interpreter's teardown of
    # torch, which would hold the job's end for a second on a busy host
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
