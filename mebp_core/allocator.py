"""The memory allocator every engine process runs under: jemalloc where the host has it,
preloaded before the interpreter starts, else glibc's malloc.

glibc's heap keeps what a step frees in holes it rarely gives back: at a short pick's peak it
held 70-84 MB free (mallinfo2), its peaks wandered from step to step, and a chain of blocks'
graphs cost 2.25x their saved tensors. jemalloc reuses a freed tensor's extent for the next
of its size class: the kernel's count was 2-10% lower at the smallest budgets, 35% lower
without checkpoints, flat across steps; wall time 0.85-0.97x (BENCHMARKS.md, "jemalloc in
every engine"). The planner counts the heap for the allocator a calibration ran under
(``HostCalibration.allocator``).

A library's malloc cannot be swapped in a running process, so each engine process is started
with ``LD_PRELOAD`` (``engine_environ``), and the ``mebp`` command starts itself again under
it (``reexec_under_engine_allocator``). ``MEBP_ALLOCATOR=glibc`` keeps glibc's malloc.

``retain:false``: jemalloc otherwise keeps the address space of what it purges mapped, which
an ``RLIMIT_DATA`` (the caps' fallback where no cgroup can be made) counts as if it were
memory.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mebp_core.errors import MebpError

ALLOCATOR_ENV = "MEBP_ALLOCATOR"
ALLOCATORS = ("jemalloc", "glibc")
JEMALLOC_SONAME = "libjemalloc.so.2"
JEMALLOC_CONF = "retain:false"
_LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                 "/usr/lib", "/usr/local/lib", "/lib/x86_64-linux-gnu", "/lib64")
_REEXEC_MARK = "MEBP_ALLOCATOR_REEXEC"


class AllocatorError(MebpError):
    """``MEBP_ALLOCATOR`` names no allocator this host can run an engine under."""


def jemalloc_library() -> Path | None:
    """Where the host's jemalloc is (Debian's ``libjemalloc2``), or None."""
    for directory in _LIBRARY_DIRS:
        path = Path(directory) / JEMALLOC_SONAME
        if path.is_file():
            return path
    return None


def engine_allocator(environ: dict[str, str] | None = None) -> str:
    """The allocator an engine started on this host runs under: ``MEBP_ALLOCATOR`` where set
    (jemalloc asked for but missing is an error), else jemalloc where installed."""
    environ = os.environ if environ is None else environ
    asked = environ.get(ALLOCATOR_ENV, "").strip().lower()
    if asked and asked not in ALLOCATORS:
        raise AllocatorError(f"{ALLOCATOR_ENV}={asked!r}: one of {', '.join(ALLOCATORS)}")
    if asked == "glibc":
        return "glibc"
    if jemalloc_library() is not None:
        return "jemalloc"
    if asked == "jemalloc":
        raise AllocatorError(f"{ALLOCATOR_ENV}=jemalloc but {JEMALLOC_SONAME} is not in "
                             f"{', '.join(_LIBRARY_DIRS)} (Debian: apt-get install libjemalloc2)")
    return "glibc"


def engine_environ(environ: dict[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) for a child that runs the engine: jemalloc
    preloaded where it is the engine's allocator."""
    environ = dict(os.environ if environ is None else environ)
    if engine_allocator(environ) != "jemalloc":
        return environ
    library = str(jemalloc_library())
    preloaded = environ.get("LD_PRELOAD", "").split()
    if library not in preloaded:
        environ["LD_PRELOAD"] = " ".join([library, *preloaded])
    conf = environ.get("MALLOC_CONF", "")
    if "retain" not in conf:  # a caller's own settings are kept
        environ["MALLOC_CONF"] = ",".join(filter(None, [conf, JEMALLOC_CONF]))
    return environ


def loaded_allocator(maps: Path = Path("/proc/self/maps")) -> str:
    """The allocator this process runs under, from the libraries it has mapped."""
    try:
        text = maps.read_text()
    except OSError:
        return "glibc"
    return "jemalloc" if "libjemalloc" in text else "glibc"


def reexec_under_engine_allocator() -> None:
    """Start this command again under the engine's allocator if it is not running under it:
    at most once (a preload the loader refused leaves the process as it is)."""
    if os.environ.pop(_REEXEC_MARK, None) is not None:
        return
    if engine_allocator() != "jemalloc" or loaded_allocator() == "jemalloc":
        return
    environ = engine_environ()
    environ[_REEXEC_MARK] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, environ)
