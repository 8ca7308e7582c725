"""The quantized GGUF bases: q4_1 holds the packed int4 weights exactly (each group of 64 is
two blocks of 32 sharing its float16 scale and bias), q8_0 approximates them; llama.cpp
itself loads both and, with the job's GGUF adapter, computes the engine's logits within
what its quantized matmul costs (it rounds the activations to 8 bits, q8_1, before a q4_1
or q8_0 product)."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
from llama_cpp_runs import llama_cpp, llama_cpp_logits, relative_error
from tiny_models import VOCAB, save_text_model, trained_adapter_logits

from mebp_core.lora.export import export_adapter
from mebp_core.store.export_base import export_base
from mebp_core.store.export_base_common import BaseExportError
from mebp_core.store.export_error import gguf_base_errors, overall_error
from mebp_core.store.pack import pack_model
from mebp_core.store.reader import open_store
from mebp_core.store.shipped import shipped_store_dir

# relative to the largest logit, with the adapter; measured on these models 1.1e-2 to 2.3e-2
# (BENCHMARKS.md), dominated by llama.cpp's 8-bit activations: q4_1's weights are exact
TOLERANCE = 3e-2
Q8_0_MAX_RELATIVE_ERROR = 1 / 127  # half a step of d = max|w| / 127, over max|w|, plus fp16


@pytest.fixture(scope="module", params=[("preset:tiny", 64), ("llama", 64), ("llama", 32)],
                ids=["tiny-preset", "llama-g64", "llama-g32"])
def packed(request, tmp_path_factory):
    """int4 stores: the tiny preset (qwen2, tied) and a llama (its q/k rows reordered)."""
    source, group_size = request.param
    tmp = tmp_path_factory.mktemp("packed")
    if source != "preset:tiny":
        source = save_text_model(tmp / "source", source, tie_word_embeddings=False,
                                 hidden_size=128, intermediate_size=256)
    return pack_model(source, tmp / "packed", quant="int4", group_size=group_size)


def test_q4_1_holds_the_packed_weights_exactly(packed, tmp_path):
    out = export_base(packed, "gguf", tmp_path / "base.gguf", gguf_quant="q4_1")
    with open_store(packed) as store:
        errors = gguf_base_errors(out, store)
        assert len(errors) == len(store.names())
    assert {e.block_type for e in errors} == {"Q4_1", "F32"}  # norms and biases stay f32
    assert overall_error("all", errors).max_abs_error == 0.0
    # gguf's own q4_1 quantizer, fed the dequantized weights, moves them: a block of 32
    # that misses its group's smallest or largest step gets another d and m
    with open_store(packed) as store:
        weight = store.dequantize("model.layers.0.mlp.down_proj.weight").numpy()
        if store.group_size == 32:
            return
    blocks = gguf.quants.quantize(weight, gguf.GGMLQuantizationType.Q4_1)
    assert not np.array_equal(gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_1),
                              weight)


def test_q8_0_approximates_them_within_half_a_step(packed, tmp_path):
    out = export_base(packed, "gguf", tmp_path / "base.gguf", gguf_quant="q8_0")
    with open_store(packed) as store:
        errors = gguf_base_errors(out, store)
    quantized = [e for e in errors if e.block_type == "Q8_0"]
    assert quantized and all(0 < e.relative_error <= Q8_0_MAX_RELATIVE_ERROR for e in quantized)
    assert all(e.max_abs_error == 0 for e in errors if e.block_type == "F32")
    # smaller than float32, larger than q4_1 (blocks of 34 bytes against 20)
    f32 = export_base(packed, "gguf", tmp_path / "f32.gguf")
    q4_1 = export_base(packed, "gguf", tmp_path / "q4_1.gguf", gguf_quant="q4_1")
    assert q4_1.stat().st_size < out.stat().st_size < f32.stat().st_size


@pytest.mark.parametrize("gguf_quant", ["q4_1", "q8_0"])
def test_llama_cpp_runs_the_quantized_base_with_the_adapter_as_the_engine_does(
        packed, gguf_quant, tmp_path):
    input_ids = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(0))
    ours = trained_adapter_logits(packed, input_ids, tmp_path / "adapter")[0].numpy()
    config = json.loads((packed / "config.json").read_text())
    adapter = export_adapter(tmp_path / "adapter", "gguf", tmp_path / "adapter.gguf",
                             base_config=config)
    base = export_base(packed, "gguf", tmp_path / "base.gguf", gguf_quant=gguf_quant)
    ids = input_ids[0].tolist()
    theirs = llama_cpp_logits(base, ids, adapter)
    error = relative_error(theirs, ours)
    assert error <= TOLERANCE, error
    plain = llama_cpp_logits(base, ids)
    assert relative_error(plain, ours) > 5 * TOLERANCE  # the adapter shows


def test_the_shipped_pretrained_model_exports_to_q4_1_exactly(tmp_path):
    packed = shipped_store_dir("pycode-12m")
    out = export_base(packed, "gguf", tmp_path / "base.gguf", gguf_quant="q4_1")
    with open_store(packed) as store:
        assert overall_error("all", gguf_base_errors(out, store)).max_abs_error == 0.0
    text = b"def add(a, b):\n    return a + b\n"
    # every token's logits (llama.cpp's default keeps the last one's alone: the rows before
    # it are uninitialized memory, which once held NaN)
    model = llama_cpp.Llama(model_path=str(out), n_ctx=64, logits_all=True, verbose=False,
                            n_threads=1)
    try:
        tokens = model.tokenize(text, add_bos=False, special=False)
        model.eval(tokens)
        assert np.isfinite(np.array(model.scores[: len(tokens)])).all()
    finally:
        model.close()


def test_block_types_without_a_matching_store_are_refused(tmp_path):
    source = save_text_model(tmp_path / "source", "qwen2")
    int8 = pack_model(source, tmp_path / "int8", quant="int8", group_size=32)
    with pytest.raises(BaseExportError, match="packed int4, not int8"):
        export_base(int8, "gguf", tmp_path / "a.gguf", gguf_quant="q4_1")
    small_groups = pack_model(source, tmp_path / "g16", quant="int4", group_size=16)
    with pytest.raises(BaseExportError, match="multiple of 32, not 16"):
        export_base(small_groups, "gguf", tmp_path / "b.gguf", gguf_quant="q8_0")
    with pytest.raises(BaseExportError, match="GGUF block type; format hf has none"):
        export_base(int8, "hf", tmp_path / "c", gguf_quant="q8_0")
    with pytest.raises(BaseExportError, match="unknown GGUF block type 'q4_0'"):
        export_base(int8, "gguf", tmp_path / "d.gguf", gguf_quant="q4_0")
    assert not list(tmp_path.glob("[abcd]*"))
