"""Presets: public architectures with seeded synthetic weights, generated as a stream, and
small models whose trained weights ship with the package (`SHIPPED_PRESETS`).

Each synthetic tensor's values come from a generator seeded by (preset, seed, tensor name),
in row chunks of a fixed size, so generation is deterministic and independent of tensor
order. A shipped preset's values are the dequantized rows of its shipped store.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from mebp_core.store.dtypes import DTYPES
from mebp_core.store.errors import PackError
from mebp_core.store.hf_checkpoint import DEFAULT_SHARD_NBYTES, write_hf_checkpoint
from mebp_core.store.preset_configs import SHIPPED_PRESETS, preset_config
from mebp_core.store.shapes import count_parameters, preset_specs
from mebp_core.store.shipped import iter_shipped_rows, shipped_sha256

PRESET_SEED = 0
CHUNK_ELEMENTS = 1 << 22  # fixed: chunking is part of what determines the values
WEIGHT_STD = 0.02


def preset_parameter_count(name: str) -> int:
    return count_parameters(preset_config(name))


def _generator(preset: str, tensor_name: str, seed: int) -> torch.Generator:
    digest = hashlib.sha256(f"{preset}:{seed}:{tensor_name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def chunk_rows_for(shape: tuple[int, ...]) -> int:
    row_elements = shape[1] if len(shape) == 2 else 1
    return max(1, CHUNK_ELEMENTS // row_elements)


def _iter_values(
    preset: str, config: dict[str, Any], tensor_name: str, shape: tuple[int, ...], seed: int
) -> Iterator[torch.Tensor]:
    dtype = DTYPES[config.get("torch_dtype", "float32")]
    if tensor_name.endswith("norm.weight"):
        if config["model_type"] == "gemma3_text":  # Gemma scales by (1 + w): keep w near 0
            g = _generator(preset, tensor_name, seed)
            yield (torch.randn(shape, generator=g) * WEIGHT_STD).to(dtype)
        else:
            yield torch.ones(shape, dtype=dtype)
        return
    g = _generator(preset, tensor_name, seed)
    step = chunk_rows_for(shape)
    for start in range(0, shape[0], step):
        rows = min(step, shape[0] - start)
        yield (torch.randn((rows, *shape[1:]), generator=g) * WEIGHT_STD).to(dtype)


def iter_preset_tensors(name: str, seed: int = PRESET_SEED) -> Iterator[tuple[str, torch.Tensor]]:
    """(tensor name, row chunk) pairs; consecutive chunks of one name stack along dim 0."""
    source = PresetSource(name, seed)
    for tensor_name, _, _ in source.specs:
        for chunk in source.iter_rows(tensor_name):
            yield tensor_name, chunk


class PresetSource:
    """A preset in the shape pack_model reads sources in."""

    def __init__(self, name: str, seed: int = PRESET_SEED):
        self.name = name
        self.seed = seed
        self.config = preset_config(name)
        self.shipped = name in SHIPPED_PRESETS
        if self.shipped and seed != PRESET_SEED:
            raise PackError(f"preset {name!r} ships trained weights: it has no seed {seed}")
        self.specs = preset_specs(self.config)
        self.shapes = {tensor: shape for tensor, shape, _ in self.specs}
        self.description = (
            {"kind": "preset", "name": name, "shipped_sha256": shipped_sha256(name)}
            if self.shipped else {"kind": "preset", "name": name, "seed": seed}
        )
        self.name_prefix_map: dict[str, str] = {}
        self.skipped: list[str] = []
        self.extra_files: list[Path] = []

    def iter_rows(self, tensor_name: str) -> Iterator[torch.Tensor]:
        shape = self.shapes[tensor_name]
        if self.shipped:
            dtype = DTYPES[self.config.get("torch_dtype", "float32")]
            yield from iter_shipped_rows(self.name, tensor_name, dtype, chunk_rows_for(shape))
            return
        yield from _iter_values(self.name, self.config, tensor_name, shape, self.seed)

    def close(self) -> None:
        pass


def load_preset_tensor(name: str, tensor_name: str, seed: int = PRESET_SEED) -> torch.Tensor:
    return torch.cat(list(PresetSource(name, seed).iter_rows(tensor_name)))


def save_preset_as_hf(
    name: str, out_dir: str | Path, max_shard_nbytes: int = DEFAULT_SHARD_NBYTES,
    seed: int = PRESET_SEED
) -> Path:
    """Write a (small) preset as a Hugging Face directory: config.json + safetensors shards."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    source = PresetSource(name, seed)
    tensors = ((tensor_name, torch.cat(list(source.iter_rows(tensor_name))))
               for tensor_name, _, _ in source.specs)
    write_hf_checkpoint(out, source.config, tensors, max_shard_nbytes)
    return out
