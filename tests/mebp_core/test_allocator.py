"""Every engine process runs under jemalloc where the host has it (``mebp_core.allocator``):
a child given the engine's environment, ``mebp train`` started from a shell, and the worker's
engines (``tests/worker/test_warm_engine.py``); ``MEBP_ALLOCATOR=glibc`` keeps glibc's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from built_by_make import missing

from mebp_core.allocator import (
    ALLOCATOR_ENV,
    AllocatorError,
    engine_allocator,
    engine_environ,
    jemalloc_library,
)

if jemalloc_library() is None:
    missing("libjemalloc2 is not installed; `make jemalloc` installs it")
PRINT_ALLOCATOR = "from mebp_core.allocator import loaded_allocator; print(loaded_allocator())"


def allocator_of_child(environ: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", PRINT_ALLOCATOR], env=environ,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def test_a_child_with_the_engines_environment_runs_under_the_engines_allocator():
    base = {key: value for key, value in os.environ.items()
            if key not in (ALLOCATOR_ENV, "LD_PRELOAD")}
    assert allocator_of_child(base) == "glibc"
    assert engine_allocator(base) == "jemalloc"
    assert allocator_of_child(engine_environ(base)) == "jemalloc"
    kept = engine_environ({**base, ALLOCATOR_ENV: "glibc"})
    assert "LD_PRELOAD" not in kept and allocator_of_child(kept) == "glibc"


def test_a_preload_of_the_callers_own_is_kept_beside_jemalloc():
    environ = engine_environ({"LD_PRELOAD": "libfoo.so", ALLOCATOR_ENV: "jemalloc"})
    assert environ["LD_PRELOAD"].split() == [str(jemalloc_library()), "libfoo.so"]
    assert engine_environ(environ)["LD_PRELOAD"] == environ["LD_PRELOAD"]  # not twice


def test_an_unknown_allocator_is_refused_by_name():
    with pytest.raises(AllocatorError, match="MEBP_ALLOCATOR='tcmalloc'"):
        engine_allocator({ALLOCATOR_ENV: "tcmalloc"})


def train_command(tmp_path) -> list[str]:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": f"line {i} of a small corpus"}) + "\n"
                            for i in range(8)))
    return [sys.executable, "-m", "mebp_core.cli", "train", "--model", "preset:tiny",
            "--data", str(data), "--out", str(tmp_path / "adapter"), "--seq-len", "32",
            "--steps", "1"]


@pytest.mark.parametrize("asked", [None, "glibc"])
def test_mebp_train_starts_itself_again_under_the_engines_allocator(asked, tmp_path,
                                                                     warm_cache):
    env = {key: value for key, value in os.environ.items()
           if key not in (ALLOCATOR_ENV, "LD_PRELOAD")}
    env.update({"MEBP_CACHE_DIR": str(warm_cache), "HF_HUB_OFFLINE": "1"})
    if asked is not None:
        env[ALLOCATOR_ENV] = asked
    done = subprocess.run(train_command(tmp_path), env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["allocator"] == (asked or "jemalloc")


def test_mebp_train_names_a_bad_allocator_setting(tmp_path, warm_cache):
    env = {**os.environ, "MEBP_CACHE_DIR": str(warm_cache), ALLOCATOR_ENV: "tcmalloc"}
    done = subprocess.run(train_command(tmp_path), env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2
    assert "MEBP_ALLOCATOR='tcmalloc'" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "adapter").exists()
