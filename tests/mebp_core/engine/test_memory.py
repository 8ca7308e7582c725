"""The one definition of memory: what the kernel charges and cannot reclaim (anonymous plus
shared), with clean file-backed pages reported apart. A shared mapping, an anonymous tensor,
a mapped file and the decompression arena each land where that definition says."""

from __future__ import annotations

import mmap

import torch

from mebp_core.engine.frozen import _Arena
from mebp_core.engine.memory import MemorySampler
from mebp_core.kernel_memory import read_memory
from mebp_core.units import MB

SIZE = 64 * MB


def fill(mapping: mmap.mmap) -> None:
    page = b"\1" * 4096  # page by page: no transient anonymous copy of the whole size
    for _ in range(SIZE // 4096):
        mapping.write(page)


def grew(before, after, field: str) -> float:
    return (getattr(after, field) - getattr(before, field)) / MB


def test_an_anonymous_tensor_is_charged_and_anonymous():
    before = read_memory()
    tensor = torch.ones(SIZE // 4)
    after = read_memory()
    assert grew(before, after, "charged_bytes") > 60 and grew(before, after, "anon_bytes") > 60
    del tensor


def test_a_shared_mapping_is_charged_though_not_anonymous():
    before = read_memory()
    shared = mmap.mmap(-1, SIZE)  # MAP_SHARED: the kernel's shmem
    fill(shared)
    after = read_memory()
    assert grew(before, after, "charged_bytes") > 60
    assert grew(before, after, "anon_bytes") < 8
    shared.close()


def test_a_mapped_file_is_reported_apart_and_not_charged(tmp_path):
    path = tmp_path / "store.bin"
    path.write_bytes(b"\2" * SIZE)
    with open(path, "rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        before = read_memory()
        total = sum(mapped[offset] for offset in range(0, SIZE, 4096))
        after = read_memory()
    assert total == 2 * SIZE // 4096
    assert grew(before, after, "file_bytes") > 60
    assert grew(before, after, "charged_bytes") < 8
    mapped.close()


def test_the_decompression_arena_is_private_anonymous_memory():
    before = read_memory()
    arena = _Arena()
    arena.take(SIZE // 4, torch.float32).fill_(1.0)
    after = read_memory()
    assert grew(before, after, "anon_bytes") > 60 and grew(before, after, "shmem_bytes") < 8
    arena.release()


def test_the_sampler_peaks_on_the_charged_figure():
    with MemorySampler() as sampler:
        shared = mmap.mmap(-1, SIZE)
        fill(shared)
        sampler.sample()
        shared.close()
    assert sampler.footprint_bytes / MB > 60  # the shared mapping counted, though freed
    assert (sampler.peak_anon_bytes - sampler.baseline_anon_bytes) / MB < 32
