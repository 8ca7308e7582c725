"""One malloc arena for the engine's process: torch's worker threads allocate from the arena
the main thread frees into (``mebp_core.proc.one_malloc_arena``, set by loading an engine)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# A fresh interpreter: the setting (or an engine loaded), threads that allocate, then
# glibc's own report of its arenas.
PROGRAM = """
import ctypes, sys, tempfile, threading
if sys.argv[1] == "setting":
    from mebp_core.proc import one_malloc_arena
    one_malloc_arena()
elif sys.argv[1] == "engine":
    from mebp_core.engine.model import load_engine_model
    load_engine_model(sys.argv[2])
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
def allocate():
    for _ in range(1000):
        libc.malloc(1024)  # small blocks: from the thread's arena, never a mapping of their own
threads = [threading.Thread(target=allocate) for _ in range(2)]
for t in threads: t.start()
for t in threads: t.join()
with tempfile.NamedTemporaryFile("r", suffix=".xml") as report:
    fp = libc.fopen(report.name.encode(), b"w")
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    print(report.read().count("<heap nr="))
"""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")


def arenas(*args: str) -> int:
    done = subprocess.run([sys.executable, "-c", PROGRAM, *args], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_threads_share_the_processs_one_arena():
    assert arenas("default") > 1  # glibc gives each allocating thread an arena of its own
    assert arenas("setting") == 1


def test_loading_an_engine_sets_one_arena(packed_models):
    assert arenas("engine", str(packed_models["llama", "int4"])) == 1
