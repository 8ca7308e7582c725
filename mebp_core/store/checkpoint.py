"""Reading a Hugging Face checkpoint directory for packing: validated up front, then streamed.

Every safetensors header is parsed and checked against its file size and against the shapes
the config implies before a single byte is written, so errors surface early and name files.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mebp_core.store.errors import PackError
from mebp_core.store.shapes import expected_shapes

if TYPE_CHECKING:
    import torch

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
# Multimodal Gemma 3 layouts (new, old) -> CausalLM names; the vision tower is left out.
_TEXT_PREFIXES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)


def read_config(src: Path) -> dict[str, Any]:
    config_file = src / "config.json"
    if not config_file.is_file():
        raise PackError(f"{config_file}: missing (not a Hugging Face model directory?)")
    try:
        return json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise PackError(f"{config_file}: invalid JSON ({exc})") from exc


def read_safetensors_header(path: Path) -> dict[str, dict[str, Any]]:
    """Tensor entries of a safetensors file, refusing one that is corrupt or truncated."""
    file_nbytes = os.path.getsize(path)
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise PackError(f"{path}: corrupt safetensors file ({file_nbytes} bytes)")
        (header_nbytes,) = struct.unpack("<Q", prefix)
        if 8 + header_nbytes > file_nbytes:
            raise PackError(f"{path}: truncated safetensors file (header past end of file)")
        try:
            header = json.loads(f.read(header_nbytes))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PackError(f"{path}: corrupt safetensors header ({exc})") from exc
    header.pop("__metadata__", None)
    end_bytes = max((int(e["data_offsets"][1]) for e in header.values()), default=0)
    if 8 + header_nbytes + end_bytes > file_nbytes:
        raise PackError(
            f"{path}: truncated safetensors file ({file_nbytes} bytes, "
            f"tensors need {8 + header_nbytes + end_bytes})"
        )
    return header


def _list_shards(src: Path) -> list[Path]:
    index_file = src / "model.safetensors.index.json"
    if index_file.is_file():
        try:
            weight_map = json.loads(index_file.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise PackError(f"{index_file}: invalid index ({exc})") from exc
        shards = [src / name for name in dict.fromkeys(weight_map.values())]
        for shard in shards:
            if not shard.is_file():
                raise PackError(f"{shard}: shard listed in {index_file.name} is missing")
        return shards
    if (src / "model.safetensors").is_file():
        return [src / "model.safetensors"]
    shards = sorted(src.glob("*.safetensors"))
    if not shards:
        raise PackError(f"{src}: no safetensors weights (model.safetensors or an index)")
    return shards


def _packed_name(key: str, multimodal: bool) -> tuple[str, str | None]:
    """(CausalLM name, (packed prefix, source prefix) used or None)."""
    if multimodal:
        for source_prefix, packed_prefix in _TEXT_PREFIXES:
            if key.startswith(source_prefix):
                return packed_prefix + key[len(source_prefix) :], (packed_prefix, source_prefix)
    return key, None


class CheckpointSource:
    """A Hugging Face directory in the shape pack_model reads sources in."""

    def __init__(self, src: Path):
        self.src = Path(src)
        if not self.src.is_dir():
            raise PackError(f"{self.src}: no such model directory")
        self.config = read_config(self.src)
        self.shapes = expected_shapes(self.config)
        multimodal = self.config.get("model_type") == "gemma3"
        located: dict[str, tuple[Path, str, dict[str, Any]]] = {}
        self.name_prefix_map: dict[str, str] = {}
        self.skipped: list[str] = []
        for shard in _list_shards(self.src):
            for key, entry in read_safetensors_header(shard).items():
                name, prefixes = _packed_name(key, multimodal)
                if name not in self.shapes:
                    self.skipped.append(key)
                    continue
                located[name] = (shard, key, entry)
                if prefixes:
                    self.name_prefix_map[prefixes[0]] = prefixes[1]
        self.specs = [self._check(name, located) for name in self.shapes]
        self._located = located
        self.description = {"kind": "hf", "path": str(self.src.resolve())}
        self.extra_files = [self.src / f for f in TOKENIZER_FILES if (self.src / f).is_file()]
        self._handles = ExitStack()
        self._open: dict[Path, Any] = {}

    def _check(self, name: str, located: dict) -> tuple[str, tuple[int, ...], str]:
        if name not in located:
            raise PackError(f"{self.src}: checkpoint has no tensor {name!r} (config implies it)")
        shard, key, entry = located[name]
        shape = tuple(entry["shape"])
        if shape != self.shapes[name]:
            raise PackError(
                f"{shard}: tensor {key!r} has shape {shape}, "
                f"config.json implies {self.shapes[name]}"
            )
        if entry["dtype"] not in SAFETENSORS_DTYPES:
            raise PackError(f"{shard}: tensor {key!r} has unsupported dtype {entry['dtype']}")
        return name, shape, SAFETENSORS_DTYPES[entry["dtype"]]

    def iter_rows(self, name: str) -> Iterator[torch.Tensor]:
        from safetensors import safe_open

        from mebp_core.store.presets import chunk_rows_for  # torch: read where it packs

        shard, key, _ = self._located[name]
        if shard not in self._open:
            self._open[shard] = self._handles.enter_context(safe_open(shard, framework="pt"))
        view = self._open[shard].get_slice(key)
        shape = self.shapes[name]
        if len(shape) != 2:
            yield view[:]
            return
        step = chunk_rows_for(shape)
        for start in range(0, shape[0], step):
            yield view[start : start + step]

    def close(self) -> None:
        self._handles.close()
        self._open.clear()
