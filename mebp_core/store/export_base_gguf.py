"""The base model as one GGUF file for llama.cpp, written as its ``convert_hf_to_gguf.py``
writes these architectures (llama, qwen2, qwen3), streamed one tensor at a time.

Weights are float32 or float16, or the packed ones in llama.cpp's q4_1 or q8_0 blocks
(``gguf_blocks.py``; norms and biases always float32, as llama.cpp's converter keeps them).
The vocabulary is the byte tokenizer's; a model with its own tokenizer is refused, since
converting arbitrary tokenizers is llama.cpp's converter's job.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from mebp_core.atomic import staged_file
from mebp_core.data.byte_vocab import CHAT_TEMPLATE, gguf_tokens, special_ids
from mebp_core.data.tokenizer import ByteTokenizer, has_tokenizer_files
from mebp_core.gguf_layout import (
    GGUFLayoutError,
    gguf_tensor_name,
    to_llama_cpp_rows,
)
from mebp_core.store.export_base_checks import GGUF_DTYPES, check_gguf_base
from mebp_core.store.export_base_common import BaseExportError, Progress, base_model_name
from mebp_core.store.gguf_blocks import q4_1_blocks, q8_0_blocks
from mebp_core.store.gguf_sizes import BLOCK_TYPES, blocks_nbytes
from mebp_core.store.reader import PackedStore
from mebp_core.store.shapes import full_text_config

GGUF_FILE_TYPES = {"q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
                   "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
def write_gguf_base(out: Path, store: PackedStore, dtype: str,
                    progress: Progress | None, gguf_quant: str | None = None) -> Path:
    config = full_text_config(store.config)
    arch = check_gguf_base(store.config, dtype)
    if has_tokenizer_files(store.path):
        raise BaseExportError(
            f"{store.path}: the model has its own tokenizer; export the base as hf and convert "
            "it with llama.cpp's convert_hf_to_gguf.py, which knows its tokenizers")
    weight_dtype, file_type = GGUF_DTYPES[dtype]
    if gguf_quant is not None:
        file_type = GGUF_FILE_TYPES[gguf_quant]
    tensors = list(gguf_tensor_plan(store, arch, config, weight_dtype, gguf_quant))
    with staged_file(out) as staging:
        writer = gguf.GGUFWriter(staging, gguf.MODEL_ARCH_NAMES[arch])
        try:
            writer.add_name(base_model_name(store.path))
            writer.add_file_type(int(file_type))
            add_hyperparameters(writer, arch, config)
            add_byte_vocabulary(writer, config["vocab_size"])
            for name, _, shape, np_dtype, block_type in tensors:
                nbytes = math.prod(shape) * np.dtype(np_dtype).itemsize
                writer.add_tensor_info(name, shape, np.dtype(np_dtype), nbytes,
                                       raw_dtype=block_type)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for i, (name, load, _, np_dtype, _) in enumerate(tensors):
                writer.write_tensor_data(np.asarray(load()).astype(np_dtype, copy=False))
                if progress is not None:
                    progress(i + 1, len(tensors), name)
        finally:
            writer.close()
    return out



PlannedTensor = tuple[str, Any, tuple[int, ...], type, gguf.GGMLQuantizationType | None]


def gguf_tensor_plan(store: PackedStore, arch: gguf.MODEL_ARCH, config: dict[str, Any],
                     weight_dtype: type, gguf_quant: str | None = None
                     ) -> Iterator[PlannedTensor]:
    """(GGUF name, loader, numpy shape, numpy dtype, block type) per tensor, the llama3 rope
    factors first where the model has them; loaders dequantize only when called. With
    ``gguf_quant``, the weights the store packed are blocks: (N, bytes) uint8 of that type."""
    rope_factors = llama3_rope_factors(config)
    if rope_factors is not None:
        name = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight"
        yield name, (lambda: rope_factors), tuple(rope_factors.shape), np.float32, None
    name_map = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    for source in store.names():
        path, _, suffix = source.rpartition(".")
        try:
            name = gguf_tensor_name(name_map, path).removesuffix(".weight") + "." + suffix
        except GGUFLayoutError as exc:
            raise BaseExportError(str(exc)) from None
        info = store.info(source)
        shape = tuple(info.shape)
        if gguf_quant is not None and info.bits is not None:
            nbytes = blocks_nbytes(shape, gguf_quant)
            yield (name, functools.partial(load_blocks, store, source, path, arch, config,
                                           gguf_quant), (shape[0], nbytes // shape[0]),
                   np.uint8, BLOCK_TYPES[gguf_quant])
            continue
        dtype = weight_dtype if len(shape) == 2 and gguf_quant is None else np.float32

        def load(source: str = source, path: str = path) -> torch.Tensor:
            return to_llama_cpp_rows(path, store.dequantize(source, torch.float32), arch, config)
        yield name, load, shape, dtype, None


def load_blocks(store: PackedStore, source: str, path: str, arch: gguf.MODEL_ARCH,
                config: dict[str, Any], gguf_quant: str) -> np.ndarray:
    """The tensor ``source`` as (N, bytes) ``gguf_quant`` blocks, rows in llama.cpp's order."""
    if gguf_quant == "q4_1":
        blocks = q4_1_blocks(store.raw(source), store.group_size)
    else:
        blocks = torch.from_numpy(q8_0_blocks(store.dequantize(source, torch.float32)))
    return to_llama_cpp_rows(path, blocks, arch, config).numpy()


def add_hyperparameters(writer: gguf.GGUFWriter, arch: gguf.MODEL_ARCH,
                        config: dict[str, Any]) -> None:
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.get("num_key_value_heads") or heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    rope = rope_parameters(config)
    writer.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    if rope.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    elif rope.get("rope_type", "default") not in ("default", "llama3"):
        raise BaseExportError(f"rope scaling {rope['rope_type']!r} is not exported to GGUF")
    if config.get("head_dim") is not None:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if arch == gguf.MODEL_ARCH.LLAMA:
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(head_dim)


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """RoPE's settings whichever way the config spells them (transformers 5 nests them)."""
    rope = dict(config.get("rope_scaling") or {})
    rope.update(config.get("rope_parameters") or {})
    if "rope_theta" in config:
        rope.setdefault("rope_theta", config["rope_theta"])
    if "type" in rope:
        rope.setdefault("rope_type", rope["type"])
    return rope


def llama3_rope_factors(config: dict[str, Any]) -> torch.Tensor | None:
    """The per-frequency factors llama.cpp reads from ``rope_freqs`` for llama3 scaling,
    computed as its converter does."""
    rope = rope_parameters(config)
    if rope.get("rope_type") != "llama3":
        return None
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    freqs = 1.0 / (rope.get("rope_theta", 10000.0)
                   ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = rope.get("factor", 8.0)
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old_context = rope.get("original_max_position_embeddings", 8192)
    factors = []
    for freq in freqs.tolist():
        wavelength = 2 * math.pi / freq
        if wavelength < old_context / high:
            factors.append(1.0)
        elif wavelength > old_context / low:
            factors.append(factor)
        else:
            smooth = (old_context / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(factors, dtype=torch.float32)


def add_byte_vocabulary(writer: gguf.GGUFWriter, vocab_size: int) -> None:
    tokens, types, merges = gguf_tokens(vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    ids = special_ids()
    writer.add_bos_token_id(ByteTokenizer.bos_token_id)
    writer.add_eos_token_id(ByteTokenizer.eos_token_id)
    writer.add_pad_token_id(ByteTokenizer.pad_token_id)
    assert sorted(ids.values()) == [ByteTokenizer.bos_token_id, ByteTokenizer.eos_token_id,
                                    ByteTokenizer.pad_token_id]
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
