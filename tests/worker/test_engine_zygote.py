"""The worker's zygote (``worker.engine_zygote``) on this machine's real kernel: the pages a
forked engine maps are charged to its own cgroup (page by page, as the kernel records them),
the engines it forks are reaped once discarded, they and it die with their worker, and a
worker whose zygote is gone starts its engines as interpreters of their own. (That a forked
engine runs, is capped and reports its peak as a started one does: ``test_warm_engine.py``,
for both kinds.)"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import signal
import subprocess
import sys
from contextlib import suppress
from pathlib import Path

import numpy as np
import pytest
from waiting import HANG_GUARD_S, poll_until

from mebp_core.units import MB
from worker.engine_zygote import (
    PAGEMAP_EXCLUSIVE,
    PAGEMAP_FILE_OR_SHARED,
    PAGEMAP_PFN,
    PAGEMAP_PRESENT,
    SPECIAL_MAPPINGS,
    Zygote,
    ZygoteError,
    _madvise,
    _mprotect,
    _populate,
    own_run,
)
from worker.memory_cap import PROCS_ENV, v1_hierarchy, v2_hierarchy
from worker.warm_engine import EngineProcess, Spare

pytestmark = pytest.mark.skipif(v1_hierarchy() is None and v2_hierarchy() is None,
                                reason="needs a cgroup memory controller")

# a worker with a horse: the horse holds the worker's end of the zygote's socket open
WORKER = """
import os, signal, sys
from pathlib import Path
from worker.engine_zygote import Zygote
from worker.warm_engine import EngineProcess
zygote = Zygote.start(Path(sys.argv[1]))
engine = EngineProcess.fork(zygote, "auto")
horse = os.fork()
if horse == 0:
    signal.pause()  # until the test kills it
    os._exit(0)
print(zygote.popen.pid, engine.pid, engine.cap.path, horse, flush=True)
signal.pause()
"""


def anonymous_mb(pid: int, group: Path) -> dict[str, float]:
    """The MB of anonymous memory process ``pid`` maps: charged by the kernel to ``group``
    (``own``) or to another cgroup (``elsewhere``, ``/proc/kpagecgroup``, root only), and
    mapped by another process too (``shared``, pagemap's exclusive bit)."""
    own, mb = os.stat(group).st_ino, {"own": 0.0, "elsewhere": 0.0, "shared": 0.0}
    with open(f"/proc/{pid}/maps") as maps, \
            open(f"/proc/{pid}/pagemap", "rb", buffering=0) as pagemap, \
            open("/proc/kpagecgroup", "rb", buffering=0) as kpagecgroup:
        for line in maps:
            fields = line.split()
            if fields[1][3] != "p" or fields[-1] in SPECIAL_MAPPINGS:
                continue
            low, high = (int(bound, 16) for bound in fields[0].split("-"))
            entries = np.frombuffer(os.pread(pagemap.fileno(), (high - low) // 4096 * 8,
                                             low // 4096 * 8), dtype=np.uint64)
            for entry in entries.tolist():
                if not entry & PAGEMAP_PRESENT or entry & PAGEMAP_FILE_OR_SHARED:
                    continue
                charged = int.from_bytes(os.pread(kpagecgroup.fileno(), 8,
                                                  (entry & PAGEMAP_PFN) * 8), "little")
                mb["own" if charged == own else "elsewhere"] += 4096 / MB
                mb["shared"] += 0 if entry & PAGEMAP_EXCLUSIVE else 4096 / MB
    return mb


def settled(engine: EngineProcess) -> dict[str, float]:
    """Its figures once its imports are done: when it blocks reading its job from its pipe
    (the kernel names the wait ``pipe_read``, ``anon_pipe_read`` or ``pipe_wait``)."""
    poll_until(lambda: "pipe" in Path(f"/proc/{engine.pid}/wchan").read_text(), bool,
               HANG_GUARD_S, lambda _: f"engine {engine.pid} never waited for its job")
    return anonymous_mb(engine.pid, engine.cap.path)


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/proc/kpagecgroup").exists(),
                    reason="reads the kernel's page-to-cgroup map (root)")
def test_a_forked_engine_is_charged_for_its_pages_at_least_as_a_started_one(warm_cache):
    zygote = Zygote.start(warm_cache)
    engines = []
    try:
        engines.append(forked := EngineProcess.fork(zygote, "auto"))
        engines.append(started := EngineProcess.start("auto", warm_cache))
        charged = {"forked": settled(forked), "started": settled(started)}
        # it shares no page with its zygote (each would be charged to the zygote's group);
        # a page or two of the kernel's zero page at most, as a started engine maps
        assert charged["forked"]["shared"] < 0.1, charged
        # what a started engine leaves charged elsewhere is its interpreter's start before it
        # joins its group; a forked one, its after-fork work before it joins
        assert charged["forked"]["elsewhere"] <= charged["started"]["elsewhere"], charged
        assert charged["forked"]["own"] >= charged["started"]["own"] - 1, charged
    finally:
        for engine in engines:
            engine.discard()
        zygote.close()


def children(pid: int) -> list[int]:
    return [int(child) for child in
            Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def gone(pid: int) -> bool:
    """Exited and reaped, or a zombie: running no more."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_the_zygote_and_its_engines_die_with_their_worker(warm_cache):
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(warm_cache)],
                              stdout=subprocess.PIPE, text=True)
    cap = horse = None
    try:
        zygote, engine, cap, horse = worker.stdout.readline().split()
        assert int(engine) in children(int(zygote))
        worker.kill()
        worker.wait()
        poll_until(lambda: gone(int(zygote)) and gone(int(engine)), bool, HANG_GUARD_S,
                   lambda _: "the zygote or its engine outlived their worker")
    finally:
        worker.kill()
        worker.wait()
        if horse is not None:
            with suppress(ProcessLookupError):
                os.kill(int(horse), signal.SIGKILL)
        if cap is not None:
            poll_until(lambda: not Path(cap).exists() or _removed(Path(cap)), bool,
                       HANG_GUARD_S, lambda _: f"cgroup {cap} still holds a process")


def _removed(group: Path) -> bool:
    try:
        group.rmdir()
        return True
    except OSError:
        return False


def test_a_discarded_engine_is_reaped_and_a_spare_outlives_its_zygote(warm_cache, capfd):
    spare = Spare("auto", warm_cache)
    try:
        spare.fill()
        forked = spare.next
        assert forked.forked and forked.waiting
        zygote = spare.zygote.popen.pid
        forked.discard()
        spare.next = None
        assert forked.pid not in children(zygote)  # reaped, not left a zombie

        spare.fill()
        os.kill(zygote, signal.SIGKILL)  # its waiting engine dies with it
        poll_until(lambda: not spare.next.waiting, bool, HANG_GUARD_S,
                   lambda _: "an engine outlived its zygote")
        handed = spare.hand_over()
        try:
            assert isinstance(handed, EngineProcess) and not handed.forked
            assert handed.waiting
            assert "engines start as interpreters of their own" in capfd.readouterr().err
        finally:
            handed.discard()
        assert spare.next is not None and not spare.next.forked  # it does not try again
    finally:
        spare.close()


def test_an_engine_that_fails_before_it_is_ready_is_known_at_once(tmp_path, warm_cache):
    zygote = Zygote.start(warm_cache)
    read_fd, write_fd = os.pipe()
    try:
        with pytest.raises(ZygoteError, match="before it was ready.*cgroup.procs"):
            zygote.fork_engine({PROCS_ENV: str(tmp_path / "gone" / "cgroup.procs")}, read_fd)
        assert zygote.popen.poll() is not None  # ended: asked nothing more
        with pytest.raises(ZygoteError):
            zygote.reap(1)
    finally:
        os.close(read_fd)
        os.close(write_fd)
        zygote.close()


@pytest.mark.parametrize("prot", [mmap.PROT_READ | mmap.PROT_WRITE, mmap.PROT_READ])
def test_a_run_partly_unmapped_since_the_maps_were_read_is_copied_where_still_mapped(prot):
    """A forked engine's own allocator unmaps what it frees while the copy runs (CPython an
    emptied arena): the kernel refuses a run with a hole in it as a whole (ENOMEM). A worker
    took that for a broken zygote and started every later engine as an interpreter. What is
    still mapped is copied now, and a read-only mapping gets its protection back."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    page = mmap.PAGESIZE
    address = libc.mmap(None, 3 * page, prot, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert address not in (None, ctypes.c_void_p(-1).value)
    try:
        assert libc.munmap(address + page, page) == 0  # the hole
        populate, mprotect = _madvise(), _mprotect()
        with pytest.raises(OSError) as refused:  # as the copy did before
            _populate(address, 3 * page, prot, populate, mprotect)
        assert refused.value.errno == errno.ENOMEM
        assert own_run(address, 3 * page, prot, populate, mprotect) == 2 * page
        expected = "rw-p" if prot & mmap.PROT_WRITE else "r--p"
        assert permissions_at(address) == permissions_at(address + 2 * page) == expected
    finally:
        libc.munmap(address, 3 * page)


def permissions_at(address: int) -> str:
    """The permissions of the mapping holding ``address`` (it may have merged with its
    neighbours)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            first, stop = (int(bound, 16) for bound in line.split()[0].split("-"))
            if first <= address < stop:
                return line.split()[1]
    raise AssertionError(f"{address:#x} is not mapped")
