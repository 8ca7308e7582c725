"""How many malloc arenas a fresh process ends with: after an optional setup, threads that
allocate, then glibc's own report (``malloc_info``)."""

from __future__ import annotations

import os
import subprocess
import sys

PROGRAM = """
import ctypes, sys, tempfile, threading
if sys.argv[1] == "setting":
    from mebp_core.proc import use_one_malloc_arena
    use_one_malloc_arena()
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


def arenas_after(setup: str, *args: str) -> int:
    """``setup``: "default" (nothing), "setting" (``use_one_malloc_arena``) or "engine"
    (``load_engine_model(args[0])``); glibc's own arena settings kept out of the environment."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES")}
    done = subprocess.run([sys.executable, "-c", PROGRAM, setup, *args], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])
