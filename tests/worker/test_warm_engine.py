"""An engine started ahead of its job (``worker.warm_engine``) on this machine's real kernel,
forked from a zygote or started as an interpreter of its own: the job's cap takes its limit
before the job is sent, the imports are charged to the job as in an engine started for it, a
horse that did not start the engine still reads how it ended, and an engine dies with the
horse it was handed to."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from waiting import HANG_GUARD_S, poll_until

from mebp_core.allocator import (
    ALLOCATOR_ENV,
    engine_allocator,
    engine_environ,
    jemalloc_library,
    loaded_allocator,
)
from mebp_core.config import TrainConfig
from mebp_core.store.resolve import resolve_model
from mebp_core.units import MB
from worker.engine_files import EngineFinished, EngineRequest, read_result, write_request
from worker.engine_zygote import Zygote
from worker.memory_cap import (
    LimitRefused,
    open_memory_cap,
    remove_stale_caps,
    v1_hierarchy,
    v2_hierarchy,
)
from worker.warm_engine import EngineProcess

pytestmark = pytest.mark.skipif(v1_hierarchy() is None and v2_hierarchy() is None,
                                reason="needs a cgroup memory controller")


def job_dir(root: Path, cache: Path, steps: int, rows: bytes | None = None) -> Path:
    """A job directory with its request: the tiny preset for ``steps`` steps."""
    directory = root / f"job-{uuid.uuid4().hex[:8]}"
    directory.mkdir()
    data = directory / "train.jsonl"
    data.write_bytes(rows if rows is not None else b"".join(
        json.dumps({"text": f"warm engine row {i} " * 3}).encode() + b"\n" for i in range(8)))
    write_request(directory, EngineRequest(
        config=TrainConfig(steps=steps, seq_len=32), model="preset:tiny",
        model_dir=resolve_model("preset:tiny", cache_dir=cache), data=data))
    return directory


@pytest.fixture(scope="module")
def zygote(warm_cache):
    zygote = Zygote.start(warm_cache)
    yield zygote
    zygote.close()


@pytest.fixture(params=["forked", "started"])
def new_engine(request, warm_cache):
    """An engine waiting for its job, forked from the zygote or started for itself."""
    if request.param == "forked":
        zygote = request.getfixturevalue("zygote")
        return lambda: EngineProcess.fork(zygote, "auto")
    return lambda: EngineProcess.start("auto", warm_cache)


@pytest.fixture
def cap_name() -> str:
    """The name an attempt's cap takes (where the kernel renames groups: cgroup v1); the
    group is removed after the test, wherever it was renamed (a horse's rename is not seen
    by the process that started the engine)."""
    job = f"test-warm-{uuid.uuid4().hex[:8]}"
    yield f"{job}-a1"
    remove_stale_caps(job)


def test_an_engine_started_ahead_runs_its_job_under_the_limit_it_is_given(
        tmp_path, warm_cache, cap_name, new_engine):
    directory = job_dir(tmp_path, warm_cache, steps=3)
    engine = new_engine()
    try:
        assert engine.cap.limit_bytes is None and engine.waiting
        waiting_name = engine.cap.path.name
        engine.assign(directory, cap_name, 900 * MB)
        renames = engine.cap.mode == "cgroup-v1"
        assert engine.cap.path.name == (cap_name if renames else waiting_name)
        assert str(engine.pid) in (engine.cap.path / "cgroup.procs").read_text().split()
        assert not engine.waiting
        limit_file = "memory.max" if engine.cap.mode == "cgroup-v2" else "memory.limit_in_bytes"
        assert int((engine.cap.path / limit_file).read_text()) == 900 * MB
        assert engine.wait(HANG_GUARD_S) == 0, (directory / "engine.log").read_text()
        warm = read_result(directory)
        assert isinstance(warm, EngineFinished) and warm.status == "succeeded", warm
        assert warm.steps == 3
    finally:
        engine.discard()

    # the same job in an engine started for it, under a cap of its own: its imports are
    # charged to the job alike, so the memory each reports is the same to within the noise
    # of an allocator
    cold_dir = job_dir(tmp_path, warm_cache, steps=3)
    cap, _ = open_memory_cap("auto", f"{cap_name}-cold", 900 * MB)
    try:
        env = engine_environ({**os.environ, **cap.child_env(),
                              "MEBP_CACHE_DIR": str(warm_cache)})
        done = subprocess.run([sys.executable, "-m", "worker.child", str(cold_dir)], env=env,
                              capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert done.returncode == 0, done.stderr
    finally:
        cap.close()
    cold = read_result(cold_dir)
    assert warm.peak_mb == pytest.approx(cold.peak_mb, rel=0.1), (warm, cold)


def test_an_engine_runs_under_the_engines_allocator(new_engine):
    expected = engine_allocator()
    assert expected == ("jemalloc" if jemalloc_library() is not None and
                        os.environ.get(ALLOCATOR_ENV) != "glibc" else "glibc")
    engine = new_engine()
    try:
        maps = Path(f"/proc/{engine.pid}/maps")
        # a started engine may still be in the loader as Popen returns: the loader maps a
        # preload before the C library (which the preload itself needs)
        poll_until(maps.read_text, lambda text: "libc.so" in text, HANG_GUARD_S,
                   lambda _: f"engine {engine.pid} never mapped the C library")
        assert loaded_allocator(maps) == expected
    finally:
        engine.discard()


def test_a_limit_below_what_the_engine_needs_ends_it_before_its_job_runs(
        tmp_path, warm_cache, cap_name, new_engine):
    directory = job_dir(tmp_path, warm_cache, steps=3)
    engine = new_engine()
    try:
        try:
            engine.assign(directory, cap_name, 24 * MB)
        except LimitRefused:  # cgroup v1 refuses a limit below what the group holds
            pass
        else:  # the limit took: the imports that follow run into it
            assert engine.wait(HANG_GUARD_S) != 0
            assert engine.cap.oom_killed()
        assert read_result(directory) is None or read_result(directory).status == "failed"
        assert not (directory / "adapter").exists()
    finally:
        engine.discard()


def run_as_horse(engine: EngineProcess, directory: Path, name: str, results,
                 follow: bool) -> None:
    """What a horse does with the engine its worker started: take it and send the job;
    then, with ``follow``, wait for its end and say how it ended, else exit once the engine
    has trained a step (a forked process, as RQ's horse is)."""
    engine.assign(directory, name, 900 * MB)
    if follow:
        results.put(engine.wait(HANG_GUARD_S))
        return
    poll_until(lambda: (directory / "metrics.jsonl").is_file()
               and (directory / "metrics.jsonl").read_text().strip(), bool, HANG_GUARD_S,
               lambda _: "the engine trained no step")


@pytest.mark.parametrize(("rows", "code"), [(None, 0), (b"{not json\n", 1)],
                         ids=["succeeded", "failed"])
def test_a_horse_reads_how_an_engine_it_did_not_start_ended(tmp_path, warm_cache, cap_name,
                                                           new_engine, rows, code):
    directory = job_dir(tmp_path, warm_cache, steps=2, rows=rows)
    engine = new_engine()
    fork = multiprocessing.get_context("fork")
    results = fork.Queue()
    try:
        horse = fork.Process(target=run_as_horse,
                             args=(engine, directory, cap_name, results, True))
        horse.start()
        horse.join(HANG_GUARD_S)
        assert horse.exitcode == 0
        assert results.get(timeout=5) == code, (directory / "engine.log").read_text()
        assert read_result(directory).status == ("succeeded" if code == 0 else "failed")
    finally:
        engine.discard()


def test_an_engine_dies_with_the_horse_it_was_handed_to(tmp_path, warm_cache, cap_name,
                                                       new_engine):
    directory = job_dir(tmp_path, warm_cache, steps=100_000)
    engine = new_engine()
    fork = multiprocessing.get_context("fork")
    try:
        horse = fork.Process(target=run_as_horse,
                             args=(engine, directory, cap_name, None, False))
        horse.start()
        horse.join(HANG_GUARD_S)  # it exits once the engine is training
        assert horse.exitcode == 0
        assert engine.wait(HANG_GUARD_S) == -signal.SIGKILL
        assert read_result(directory) is None
    finally:
        engine.discard()


def test_an_engine_with_a_job_outlives_the_zygote_it_was_forked_from(tmp_path, warm_cache,
                                                                    cap_name):
    directory = job_dir(tmp_path, warm_cache, steps=3)
    zygote = Zygote.start(warm_cache)
    engine = EngineProcess.fork(zygote, "auto")
    try:
        # a stop signalled to the whole service (systemd signals every process of the unit)
        # is the worker's to act on: the zygote ignores it
        os.kill(zygote.popen.pid, signal.SIGTERM)
        engine.assign(directory, cap_name, 900 * MB)
        assert zygote.popen.poll() is None
        zygote.close()  # ended all the same (the host's OOM killer, say): the job goes on
        engine.wait_exit(HANG_GUARD_S)
        finished = read_result(directory)
        assert isinstance(finished, EngineFinished) and finished.steps == 3, \
            (directory / "engine.log").read_text()
    finally:
        engine.discard()
