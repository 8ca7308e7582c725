"""One process that has imported what training needs, from which a worker forks the engine
it keeps waiting for the next job: an engine ready in tens of milliseconds, where starting an
interpreter and importing torch takes seconds of a core the running job needs.

A forked engine's first act is to join its own cgroup; its second is to take a copy of every
page it still shares with the zygote (``own_inherited_pages``). The kernel charges a page to
the cgroup of the process that faults it in, so without the copy the imports would stay
charged to the zygote's group, and a job's cap would hold less than an engine started for it
holds. With it, the job's group is charged what a started engine's is, and every limit and
figure downstream is unchanged.

The zygote answers a fork only once the engine has its copies (it writes nothing of its own
meanwhile, its garbage collector off: a page it wrote first would stay charged to it), so an
engine handed over is ready and fully charged, and one that failed is known. It is its
engines' parent and keeps each one's exit status (a zombie) until the worker asks it to reap
it, after the horse that ran the engine's job has read that status (``worker.warm_engine``).
It runs no torch op before forking, so an engine starts torch's OpenMP pool itself rather
than inheriting one whose threads the fork did not copy. It ignores stop signals (the worker
ends it) and dies with its worker; an engine waiting for a job dies with it, one that has a
job lives and dies with its horse.

    python -m worker.engine_zygote SOCKET_FD WORKER_PID
"""

from __future__ import annotations

import ctypes
import errno
import gc
import json
import mmap
import os
import signal
import socket
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np

from mebp_core.allocator import engine_environ

MADV_POPULATE_WRITE = 23  # Linux 5.14: fault pages in as if written (a shared one is copied)
PAGEMAP_PRESENT, PAGEMAP_SWAPPED = 1 << 63, 1 << 62
PAGEMAP_FILE_OR_SHARED, PAGEMAP_EXCLUSIVE = 1 << 61, 1 << 56
PAGEMAP_PFN = (1 << 55) - 1
PROT = {"r": mmap.PROT_READ, "w": mmap.PROT_WRITE, "x": mmap.PROT_EXEC}
# mappings of the kernel's own, not memory of the process
SPECIAL_MAPPINGS = ("[vvar]", "[vvar_vclock]", "[vdso]", "[vsyscall]", "[uprobes]")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PR_SET_NAME = 15  # linux/prctl.h: the name ps and top show (a fork keeps its parent's argv)
ZYGOTE_NAME, ENGINE_NAME = b"mebp-zygote", b"mebp-engine"
REPLY_TIMEOUT_S = 120.0  # the zygote's imports, before its first fork, on a host at any load
EXIT_UNSUPPORTED = 3
MESSAGE_BYTES = 65536


class ZygoteError(OSError):
    """The zygote could not fork an engine: it is gone, or this kernel cannot charge a forked
    engine as a started one."""


class Zygote:
    """The worker's handle on its zygote process."""

    def __init__(self, popen: subprocess.Popen, sock: socket.socket) -> None:
        self.popen, self.sock = popen, sock
        self.broken: str | None = None  # why it is no longer asked anything

    @classmethod
    def start(cls, cache_dir: Path) -> Zygote:
        """Start one, importing; the first ``fork_engine`` waits for its imports."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            popen = subprocess.Popen(
                [sys.executable, "-m", "worker.engine_zygote", str(theirs.fileno()),
                 str(os.getpid())], pass_fds=(theirs.fileno(),),
                # the engine finds the kernel its worker built in the same cache; a group of
                # its own, so a stop signalled to the service's group does not end it (and,
                # with it, the engine of the job that is stopping)
                env=engine_environ({**os.environ, "MEBP_CACHE_DIR": str(cache_dir)}),
                process_group=0)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(REPLY_TIMEOUT_S)
        return cls(popen, ours)

    def fork_engine(self, env: dict[str, str], control_fd: int) -> int:
        """A new engine's pid, once it has joined the cap that ``env`` names
        (``MemoryCap.child_env``) and taken its copies; it waits for its job on
        ``control_fd`` (``python -m worker.child --wait``)."""
        return int(self._ask({"fork": env}, [control_fd])["pid"])

    def reap(self, pid: int) -> int:
        """Wait for engine ``pid`` to exit and reap it; its exit code as Popen gives it."""
        return int(self._ask({"reap": pid})["returncode"])

    def _ask(self, request: dict, fds: list[int] = ()) -> dict:
        """Its reply. After a failure it is ended and asked nothing more (a reply late or
        lost would answer the next question); an engine it forked that has a job goes on."""
        if self.broken is None:
            try:
                socket.send_fds(self.sock, [json.dumps(request).encode()], list(fds))
                reply = self.sock.recv(MESSAGE_BYTES)
                if reply:
                    answer = json.loads(reply)
                    if "error" not in answer:
                        return answer
                    self.broken = answer["error"]
                else:
                    code = self.popen.wait()
                    self.broken = f"exited with code {code}" + (
                        " (this kernel cannot charge a forked engine its pages: "
                        "MADV_POPULATE_WRITE, Linux 5.14)" if code == EXIT_UNSUPPORTED else "")
            except BaseException as exc:
                self.broken = f"{type(exc).__name__}: {exc}"
                if not isinstance(exc, (OSError, ValueError)):
                    self.close()
                    raise
            self.close()
        raise ZygoteError(f"the engine zygote (pid {self.popen.pid}): {self.broken}")

    def close(self) -> None:
        """End it (an engine it forked still waiting for a job dies with it)."""
        self.sock.close()
        self.popen.kill()
        self.popen.wait()


def own_inherited_pages() -> int:
    """Copy every anonymous page this process still shares with the process it was forked
    from, so that the kernel charges it to this process's cgroup as it would a page this
    process had faulted in itself; the bytes copied. Pages in memory or in swap, in every
    private mapping (read-only ones too: a library's relocated data is written once, then
    protected); not a page never touched (unallocated, as in a started process) nor the
    shared zero page (memory read but never written, charged to nobody)."""
    page, copied = mmap.PAGESIZE, 0
    zero_pfn = _zero_page_pfn()
    populate = _madvise()
    mprotect = _mprotect()
    with open("/proc/self/maps") as maps:
        regions = [(line.split()[0], line.split()[1]) for line in maps
                   if line.split()[1][3] == "p" and line.split()[-1] not in SPECIAL_MAPPINGS]
    with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
        for bounds, perms in regions:
            start, end = (int(bound, 16) for bound in bounds.split("-"))
            entries = _pagemap_entries(pagemap.fileno(), start // page, (end - start) // page)
            prot = sum(PROT[flag] for flag in perms[:3] if flag in PROT)
            for first, count in _shared_runs(entries, zero_pfn):
                copied += own_run(start + first * page, count * page, prot, populate, mprotect)
    return copied


def own_run(address: int, length: int, prot: int, populate, mprotect) -> int:
    """Copy a run of inherited pages (``prot``: the mapping's protection); the bytes
    copied. Part of the run may be gone since the maps were read: this process's own
    allocator unmaps what it frees (CPython an emptied arena) as the loop above allocates
    and frees, and the kernel then refuses the whole run (ENOMEM, "no VMA"). What is still
    mapped is copied; a run still wholly mapped that fails is out of memory, and raised."""
    try:
        _populate(address, length, prot, populate, mprotect)
        return length
    except OSError as exc:
        if exc.errno != errno.ENOMEM:
            raise
        parts = mapped_parts(address, length)
        mapped = sum(stop - first for first, stop in parts)
        if mapped == length:
            raise
    for first, stop in parts:
        _populate(first, stop - first, prot, populate, mprotect)
    return mapped


def _populate(address: int, length: int, prot: int, populate, mprotect) -> None:
    if not prot & mmap.PROT_WRITE:
        mprotect(address, length, prot | mmap.PROT_WRITE)
    populate(address, length)
    if not prot & mmap.PROT_WRITE:
        mprotect(address, length, prot)


def mapped_parts(address: int, length: int) -> list[tuple[int, int]]:
    """(first, stop) of each part of [address, address + length) mapped now."""
    end, parts = address + length, []
    with open("/proc/self/maps") as maps:
        for line in maps:
            first, stop = (int(bound, 16) for bound in line.split()[0].split("-"))
            if first < end and stop > address:
                parts.append((max(first, address), min(stop, end)))
    return parts


def _shared_runs(entries: np.ndarray, zero_pfn: int) -> list[tuple[int, int]]:
    """(first page, pages) of each run of anonymous pages, in memory or swap, not mapped by
    this process alone, and not the zero page."""
    def bits(mask: int) -> np.ndarray:
        return entries & np.uint64(mask)

    wanted = (bits(PAGEMAP_PRESENT | PAGEMAP_SWAPPED) != 0) \
        & (bits(PAGEMAP_FILE_OR_SHARED) == 0) & (bits(PAGEMAP_EXCLUSIVE) == 0)
    if zero_pfn >= 0:
        wanted &= ~((bits(PAGEMAP_PRESENT) != 0) & (bits(PAGEMAP_PFN) == np.uint64(zero_pfn)))
    edges = np.flatnonzero(np.diff(np.concatenate(([0], wanted.astype(np.int8), [0]))))
    return [(int(first), int(stop - first))
            for first, stop in zip(edges[::2], edges[1::2], strict=True)]


def _pagemap_entries(fd: int, first_page: int, pages: int) -> np.ndarray:
    data, offset, size = bytearray(), first_page * 8, pages * 8
    while len(data) < size:
        chunk = os.pread(fd, size - len(data), offset + len(data))
        if not chunk:
            break
        data += chunk
    return np.frombuffer(bytes(data), dtype=np.uint64)


def _madvise():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)

    def populate_write(address: int, length: int) -> None:
        if libc.madvise(address, length, MADV_POPULATE_WRITE) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"madvise(MADV_POPULATE_WRITE) at {address:#x}: "
                                 f"{os.strerror(error)}")

    return populate_write


def _mprotect():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)

    def protect(address: int, length: int, prot: int) -> None:
        if libc.mprotect(address, length, prot) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"mprotect at {address:#x}: {os.strerror(error)}")

    return protect


def _zero_page_pfn() -> int:
    """The page frame of the kernel's shared zero page (what a read of never-written
    anonymous memory maps), read off a fresh page of our own; -1 where pagemap hides frame
    numbers (not root)."""
    probe = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        probe[0]  # a read: maps the zero page
        buffer = ctypes.c_char.from_buffer(probe)
        address = ctypes.addressof(buffer)
        del buffer
        with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
            entry = _pagemap_entries(pagemap.fileno(), address // mmap.PAGESIZE, 1)[0]
        return entry & PAGEMAP_PFN if entry & PAGEMAP_PFN else -1
    finally:
        probe.close()


def _supported() -> bool:
    """Whether this kernel populates pages for writing (MADV_POPULATE_WRITE)."""
    probe = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        buffer = ctypes.c_char.from_buffer(probe)
        address = ctypes.addressof(buffer)
        del buffer
        _madvise()(address, mmap.PAGESIZE)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _name_process(name: bytes) -> None:
    ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


def become_engine(env: dict[str, str], control_fd: int, ready_fd: int, zygote: int) -> None:
    """In a forked child: be the waiting engine ``python -m worker.child --wait FD`` would
    be, charged as one; say "ready" (or why not) on ``ready_fd``; never returns."""
    code = 1
    try:
        from mebp_core.proc import die_with_parent
        from worker import child
        from worker.memory_cap import PROCS_ENV, join_from_env

        join_from_env(env)  # first, so that the copies below are charged to the job's group
        for number in STOP_SIGNALS:
            signal.signal(number, signal.SIG_DFL)
        if PROCS_ENV in env:  # a cgroup counts pages; RLIMIT_DATA counts the address space
            own_inherited_pages()
        gc.enable()  # off in the zygote
        _name_process(ENGINE_NAME)
        os.setpgid(0, 0)
        die_with_parent(signal.SIGKILL, zygote)  # until a horse takes it (worker.child)
        os.write(ready_fd, b"ready")
        os.close(ready_fd)
        ready_fd = -1
        code = child.serve([child.WAIT_FLAG, str(control_fd)])
    except BaseException as exc:  # noqa: BLE001  never return into the zygote's loop
        traceback.print_exc()
        if ready_fd >= 0:
            os.write(ready_fd, f"{type(exc).__name__}: {exc}".encode()[:MESSAGE_BYTES // 2])
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(sock: socket.socket) -> None:
    zygote = os.getpid()
    while True:
        message, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 1)
        if not message:
            return  # the worker closed its end
        request = json.loads(message)
        if "reap" in request:
            reply = _reap(int(request["reap"]))
        else:
            reply = _fork_engine(request["fork"], fds[0], sock, zygote)
        sock.send(json.dumps(reply).encode())


def _reap(pid: int) -> dict:
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError as exc:
        return {"error": f"reaping engine {pid}: {exc}"}
    return {"returncode": os.waitstatus_to_exitcode(status)}


def _fork_engine(env: dict[str, str], control_fd: int, sock: socket.socket,
                 zygote: int) -> dict:
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        sock.close()
        os.close(ready_read)
        become_engine(env, control_fd, ready_write, zygote)
    os.close(ready_write)
    said = os.read(ready_read, MESSAGE_BYTES)  # blocks, writing nothing, until it has copied
    os.close(ready_read)
    os.close(control_fd)
    if said == b"ready":
        return {"pid": pid}
    os.waitpid(pid, 0)
    return {"error": f"a forked engine failed before it was ready: "
                     f"{said.decode(errors='replace') or 'it exited'}"}


def main(argv: list[str]) -> int:
    from mebp_core.proc import die_with_parent

    sock = socket.socket(fileno=int(argv[0]))
    die_with_parent(signal.SIGKILL, int(argv[1]))
    # the worker ends it; a stop signalled to its service (systemd signals every process
    # of the unit) must not end it with the engines it forked
    for number in STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    _name_process(ZYGOTE_NAME)
    if not _supported():
        print("mebp worker: this kernel cannot charge a forked engine its pages "
              "(MADV_POPULATE_WRITE, Linux 5.14): each engine starts an interpreter",
              file=sys.stderr, flush=True)
        return EXIT_UNSUPPORTED
    import mebp_core.engine.train  # noqa: F401  what an engine's first step needs
    import worker.child  # noqa: F401
    import worker.engine_files  # noqa: F401

    # a collection would write to every object's header, so that pages the engines still
    # share with it are charged to it; none of what it imported is garbage
    gc.disable()
    gc.freeze()
    serve(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
