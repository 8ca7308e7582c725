"""Writing a Hugging Face checkpoint directory from a stream of tensors: ``config.json`` plus
safetensors shards of bounded size, with ``model.safetensors.index.json`` when there are
several (a single ``model.safetensors`` when everything fits one shard)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

DEFAULT_SHARD_NBYTES = 1 << 30


def write_hf_checkpoint(out: Path, config: dict[str, Any],
                        tensors: Iterable[tuple[str, torch.Tensor]],
                        max_shard_nbytes: int = DEFAULT_SHARD_NBYTES) -> list[Path]:
    """Write ``config`` and ``tensors`` into the existing directory ``out``; at most one shard
    is held in memory. Returns the files written."""
    from safetensors.torch import save_file

    shard_names: list[list[str]] = []
    shard: dict[str, torch.Tensor] = {}
    shard_nbytes = total_nbytes = 0
    staged: list[Path] = []

    def flush() -> None:
        path = out / f".shard-{len(shard_names):05d}.safetensors"
        save_file(shard, path, metadata={"format": "pt"})
        staged.append(path)
        shard_names.append(list(shard))
        shard.clear()

    for name, tensor in tensors:
        if shard and shard_nbytes + tensor.nbytes > max_shard_nbytes:
            flush()
            shard_nbytes = 0
        shard[name] = tensor.contiguous()
        shard_nbytes += tensor.nbytes
        total_nbytes += tensor.nbytes
    flush()
    written = [out / "config.json"]
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if len(staged) == 1:
        staged[0].rename(out / "model.safetensors")
        return [*written, out / "model.safetensors"]
    weight_map = {}
    for i, (path, names) in enumerate(zip(staged, shard_names, strict=True)):
        final = out / f"model-{i + 1:05d}-of-{len(staged):05d}.safetensors"
        path.rename(final)
        written.append(final)
        weight_map.update(dict.fromkeys(names, final.name))
    index = {"metadata": {"total_size": total_nbytes}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return [*written, out / "model.safetensors.index.json"]
