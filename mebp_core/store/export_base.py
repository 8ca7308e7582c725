"""The base model an adapter applies to, exported for a runtime.

The weights are the packed store's: the exact weights the adapter was trained against (int4
values times their scales), not the checkpoint they were packed from. ``hf`` writes them
dequantized as a Hugging Face directory that ``from_pretrained`` loads; ``gguf`` one
llama.cpp file (dequantized, or in llama.cpp's q4_1/q8_0 blocks); ``mlx`` the packed arrays
as MLX quantized weights, a directory ``mlx_lm.load`` loads.
A model without tokenizer files (the presets) gets the byte tokenizer written out, so text
encodes to the ids it was trained on in every runtime.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

from mebp_core.atomic import staged_directory
from mebp_core.data.tokenizer import ByteTokenizer, has_tokenizer_files, read_vocab_size
from mebp_core.store.checkpoint import TOKENIZER_FILES
from mebp_core.store.dtypes import DTYPES
from mebp_core.store.export_base_checks import check_base_format
from mebp_core.store.export_base_common import BaseExportError, BaseFormat, Progress
from mebp_core.store.hf_checkpoint import write_hf_checkpoint
from mebp_core.store.reader import PackedStore, open_store


def base_tensors(store: PackedStore, dtype: torch.dtype,
                 progress: Progress | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, weight) in store order, dequantized to ``dtype`` one tensor at a time."""
    names = store.names()
    for i, name in enumerate(names):
        yield name, store.dequantize(name, dtype)
        if progress is not None:
            progress(i + 1, len(names), name)


def check_exportable(store: PackedStore, fmt: str, dtype: str,
                     gguf_quant: str | None = None) -> None:
    check_base_format(store.config, fmt, dtype, quant=store.quant,
                      group_size=store.group_size, gguf_quant=gguf_quant)
    if store.name_prefix_map:
        raise BaseExportError(f"{store.path}: a multimodal model's base would lack its vision "
                              "tower; only text models are exported")


def export_base(model_dir: str | Path, fmt: BaseFormat, out: str | Path, *,
                dtype: str = "float32", gguf_quant: str | None = None,
                progress: Progress | None = None) -> Path:
    """Write the base of the packed model ``model_dir`` as ``fmt`` to ``out`` (a directory
    for hf and mlx, a file for gguf, whose blocks are ``gguf_quant`` when given); an
    existing ``out`` is replaced only once the new one is whole."""
    out = Path(out)
    with open_store(model_dir) as store:
        check_exportable(store, fmt, dtype, gguf_quant)
        if fmt == "gguf":
            from mebp_core.store.export_base_gguf import write_gguf_base

            return write_gguf_base(out, store, dtype, progress, gguf_quant)
        with staged_directory(out) as staging:
            if fmt == "mlx":
                write_mlx_base(staging, store, dtype, progress)
            else:
                write_hf_base(staging, store, dtype, progress)
    return out


def write_hf_base(out: Path, store: PackedStore, dtype: str,
                  progress: Progress | None) -> None:
    config = {**store.config, "torch_dtype": dtype}
    write_hf_checkpoint(out, config, base_tensors(store, DTYPES[dtype], progress))
    write_tokenizer(out, store)


def write_mlx_base(out: Path, store: PackedStore, dtype: str,
                   progress: Progress | None) -> None:
    from mebp_core.store.export_base_mlx import mlx_config, mlx_tensors

    write_hf_checkpoint(out, mlx_config(store), mlx_tensors(store, dtype, progress))
    write_tokenizer(out, store)


def write_tokenizer(out: Path, store: PackedStore) -> None:
    """The model's tokenizer files, else the byte tokenizer the engine encoded text with."""
    vocab_size = read_vocab_size(store.config)
    if has_tokenizer_files(store.path):
        for name in TOKENIZER_FILES:
            if (store.path / name).is_file():
                shutil.copyfile(store.path / name, out / name)
    elif vocab_size >= ByteTokenizer.MIN_VOCAB_SIZE:  # smaller: never trained on text
        from mebp_core.data.byte_vocab import write_hf_tokenizer

        write_hf_tokenizer(out, vocab_size)
