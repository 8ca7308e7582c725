"""A service's or worker's process tree in the stop tests: list it, wait for every process of
it to exit within the bound a stop has, and kill whatever outlives a test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil
from waiting import poll_until

STOP_BOUND_S = 10.0  # what systemd and `docker stop` give before their SIGKILL


def process_tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def alive(process: psutil.Process) -> bool:
    try:  # is_running also tells a reused pid from the process
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def describe(processes: list[psutil.Process]) -> list[str]:
    described = []
    for process in processes:
        try:
            described.append(f"{process.pid} {process.name()}: "
                             f"{' '.join(process.cmdline())[:120]}")
        except psutil.Error:
            described.append(f"{process.pid} (gone)")
    return described


@contextmanager
def killed_after(processes: list[psutil.Process]) -> Iterator[None]:
    """Whatever the test finds, no process it signalled outlives it."""
    try:
        yield
    finally:
        for process in processes:
            if alive(process):
                process.kill()


def kill_tree(pid: int) -> None:
    with suppress(psutil.NoSuchProcess), killed_after(process_tree(pid)):
        pass


def wait_until_exited(processes: list[psutil.Process], timeout_s: float, after: str,
                      log: Path | None = None) -> None:
    """Wait until no process of ``processes`` is alive, at most ``timeout_s``; else fail
    naming those left, what they outlived (``after``) and the tail of ``log``."""
    def failure(left: list[psutil.Process]) -> str:
        tail = f"\n{log.read_text()[-3000:]}" if log is not None else ""
        return f"{len(left)} processes alive {STOP_BOUND_S:.0f} s after {after}: " \
               f"{describe(left)}{tail}"
    poll_until(lambda: [process for process in processes if alive(process)],
               lambda left: not left, timeout_s, failure, interval_s=0.1)
