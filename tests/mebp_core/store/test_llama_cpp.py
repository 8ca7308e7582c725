"""llama.cpp itself (llama-cpp-python, built from its PyPI sdist by ``make test``) runs the
GGUF base with the GGUF adapter applied, and its logits are PEFT's on the exported HF base;
its tokenizer encodes text to the byte ids training used."""

from __future__ import annotations

import json

import pytest
import torch
from llama_cpp_runs import llama_cpp, llama_cpp_logits, relative_error
from peft import PeftModel
from tiny_models import VOCAB, save_text_model, trained_engine
from transformers import AutoModelForCausalLM

from mebp_core.lora.export import export_adapter
from mebp_core.store.export_base import export_base
from mebp_core.store.pack import pack_model

# float32 weights and, asked for, a float32 KV cache (llama.cpp's default is float16, which
# alone costs ~2e-4); llama.cpp still sums in another order and ropes in its own layout
TOLERANCE = 1e-4


@pytest.fixture
def exported(tmp_path, request):
    """A packed tiny model with a trained-like adapter, exported in both formats."""
    model_type, tied = request.param
    source = save_text_model(tmp_path / "source", model_type, tie_word_embeddings=tied)
    packed = pack_model(source, tmp_path / "packed", quant="int4", group_size=32)
    engine = trained_engine(packed)
    engine.save_adapter(tmp_path / "adapter")
    engine.close()
    export_base(packed, "hf", tmp_path / "base")
    export_base(packed, "gguf", tmp_path / "base.gguf")
    export_adapter(tmp_path / "adapter", "gguf", tmp_path / "adapter.gguf",
                   base_config=json.loads((packed / "config.json").read_text()))
    return tmp_path


@pytest.mark.parametrize("exported", [("llama", False), ("qwen2", True)], indirect=True,
                         ids=["llama", "qwen2-tied"])
def test_llama_cpp_applies_the_gguf_adapter_as_peft_does(exported):
    input_ids = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(0))
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(exported / "base"),
                                     exported / "adapter")
    with torch.no_grad():
        adapted = peft(input_ids=input_ids).logits[0].numpy()
        with peft.disable_adapter():
            base = peft(input_ids=input_ids).logits[0].numpy()
    ids = input_ids[0].tolist()
    theirs_base = llama_cpp_logits(exported / "base.gguf", ids)
    theirs = llama_cpp_logits(exported / "base.gguf", ids, exported / "adapter.gguf")
    assert relative_error(theirs_base, base) <= TOLERANCE
    assert relative_error(theirs, adapted) <= TOLERANCE
    # the adapter moves the logits far more than the runtimes disagree
    assert relative_error(adapted, base) > 100 * TOLERANCE


def test_llama_cpp_tokenizes_text_to_the_byte_ids_training_used(tmp_path):
    source = save_text_model(tmp_path / "source", "qwen2")
    packed = pack_model(source, tmp_path / "packed", quant="int4", group_size=32)
    export_base(packed, "gguf", tmp_path / "base.gguf")
    model = llama_cpp.Llama(model_path=str(tmp_path / "base.gguf"), n_ctx=64, verbose=False,
                            vocab_only=True)
    try:
        for text in ("héllo wörld", "  two  spaces\n\ttab", "emoji 😀 and ﬁ", "ÿÿ"):
            encoded = text.encode()
            assert model.tokenize(encoded, add_bos=False, special=False) == list(encoded)
            assert model.detokenize(list(encoded)) == encoded
        assert (model.token_bos(), model.token_eos()) == (256, 257)
    finally:
        model.close()
