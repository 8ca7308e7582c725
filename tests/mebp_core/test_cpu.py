"""CPU capabilities from /proc/cpuinfo, the dtype bf16 matmuls run in, and the cores free
for a job's threads, from /proc/stat."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from waiting import poll_until

from mebp_core.cpu import (
    IdleWindow,
    cpu_flags,
    cpu_model,
    idle_cores,
    matmul_dtype,
    native_bf16_matmul,
    process_cpu_s,
    threads_for_idle_cores,
    torch_default_threads,
)

AVX2_HOST = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx avx2 fma f16c
"""
AMX_HOST = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum
flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile
"""
ARM_BF16_HOST = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes sve bf16 i8mm
"""
ARM_HOST = """processor\t: 0
Features\t: fp asimd evtstrm aes crc32
"""


@pytest.mark.parametrize(("cpuinfo", "native"), [
    (AVX2_HOST, False), (AMX_HOST, True), (ARM_BF16_HOST, True), (ARM_HOST, False), ("", False)])
def test_native_bf16_is_read_from_the_instruction_flags(cpuinfo, native):
    assert native_bf16_matmul(cpuinfo) is native


def test_this_hosts_flags_and_model_are_read():
    flags = cpu_flags()
    assert flags & {"fpu", "fp", "sse2", "asimd"}, "no base ISA flag found in /proc/cpuinfo"
    assert cpu_model()


def test_only_bfloat16_is_ever_upcast():
    assert matmul_dtype("float32", "float32") == "float32"
    assert matmul_dtype("float32", "auto") == "float32"
    assert matmul_dtype("bfloat16", "native") == "bfloat16"
    assert matmul_dtype("bfloat16", "float32") == "float32"
    auto = "bfloat16" if native_bf16_matmul() else "float32"
    assert matmul_dtype("bfloat16", "auto") == auto


@pytest.mark.parametrize("sample", [lambda: idle_cores(0.5),
                                    lambda: IdleWindow().idle_cores(min_window_s=0.5)],
                         ids=["idle_cores", "IdleWindow"])
def test_cores_kept_busy_are_not_counted_idle_and_take_no_thread(all_cores_but_one_busy,
                                                                  sample):
    idle = sample()
    assert idle is not None and 0 <= idle <= 1.2  # at most the one core not kept busy
    assert threads_for_idle_cores(idle, os.cpu_count()) == 1


@pytest.mark.parametrize(("idle", "cores", "threads"), [
    (1.95, 2, 2), (1.5, 2, 1), (0.97, 2, 1), (0.0, 2, 1), (7.9, 8, 8), (3.85, 8, 4),
    (None, 4, 4), (2.6, 2, 2)])
def test_one_thread_per_core_that_is_mostly_idle(idle, cores, threads):
    assert threads_for_idle_cores(idle, cores) == threads


def test_a_process_cpu_time_grows_while_it_spins_and_reads_zero_once_it_is_gone():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        first = process_cpu_s(spinner.pid)
        poll_until(lambda: process_cpu_s(spinner.pid), lambda now: now > first, 60,
                   lambda now: f"no CPU time counted: {first} then {now}")
    finally:
        spinner.kill()
        spinner.wait()
    assert process_cpu_s(spinner.pid) == 0.0


def test_work_of_its_own_counts_as_idle_in_a_window(all_cores_but_one_busy):
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        counted_free, counted_busy = IdleWindow((spinner.pid,)), IdleWindow()
        busy, free = counted_busy.idle_cores(1.0), counted_free.idle_cores(1.0)
    finally:
        spinner.kill()
        spinner.wait()
    assert free > busy  # the spinner's share of the same second, counted idle


@pytest.mark.parametrize(("environ", "cpus"), [
    ({}, None), ({}, {0}), ({"OMP_NUM_THREADS": "1"}, None), ({"MKL_NUM_THREADS": "1"}, None),
    ({"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "1"}, None)])
def test_torch_default_threads_is_the_count_torch_takes(environ, cpus):
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS",
                                                                "MKL_NUM_THREADS")}
    done = subprocess.run(
        [sys.executable, "-c", "import torch; from mebp_core.cpu import torch_default_threads;"
         " print(torch.get_num_threads(), torch_default_threads())"],
        env={**clean, **environ}, capture_output=True, text=True, check=True, timeout=120,
        preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus))
    torch_count, ours = done.stdout.split()
    assert ours == torch_count


def _sysfs(root, topology):
    root.mkdir()
    for cpu, (package, core) in topology.items():
        directory = root / f"cpu{cpu}" / "topology"
        directory.mkdir(parents=True)
        (directory / "physical_package_id").write_text(f"{package}\n")
        (directory / "core_id").write_text(f"{core}\n")
    return root


def test_torch_default_threads_counts_physical_cores_across_packages(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    # two packages of two cores with two hyperthreads each, numbered as Linux does
    smt = _sysfs(tmp_path / "smt", {cpu: (cpu // 4, cpu % 2) for cpu in range(8)})
    assert torch_default_threads(smt, cpus=set(range(8))) == 4
    assert torch_default_threads(smt, cpus={0, 1}) == 2  # one package's two cores
    assert torch_default_threads(smt, cpus={0, 2}) == 1  # one core's two hyperthreads
    # a CPU whose topology is not there counts as a core
    assert torch_default_threads(smt, cpus={0, 9}) == 2
