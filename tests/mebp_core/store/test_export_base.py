"""The exported base is the one the adapter was trained against: PEFT, loading a saved adapter
by the base name it carries, computes the engine's logits on the exported weights; the byte
tokenizer written beside them encodes text to the ids training used."""

from __future__ import annotations

import json

import pytest
import torch
from peft import AutoPeftModelForCausalLM
from tiny_models import VOCAB, save_text_model, tiny_config, trained_adapter_logits
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from mebp_core.cli import main
from mebp_core.data.tokenizer import ByteTokenizer
from mebp_core.store.export_base import export_base
from mebp_core.store.export_base_common import BaseExportError, base_model_name
from mebp_core.store.pack import pack_model

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo ✓"},
            {"role": "assistant", "content": "hi <s> there"}]


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "gemma3_text"])
def test_peft_applies_the_adapter_to_the_exported_base_as_the_engine_does(
        model_type, tmp_path, monkeypatch):
    source = save_text_model(tmp_path / "source", model_type)
    packed = pack_model(source, tmp_path / "packed", quant="int4", group_size=32)
    input_ids = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(0))
    ours = trained_adapter_logits(packed, input_ids, tmp_path / "adapter")

    name = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())[
        "base_model_name_or_path"]
    assert name == base_model_name(packed)
    export_base(packed, "hf", tmp_path / name)
    monkeypatch.chdir(tmp_path)  # the adapter names its base as a directory beside it
    model = AutoPeftModelForCausalLM.from_pretrained("adapter")
    with torch.no_grad():
        theirs = model(input_ids=input_ids).logits
        with model.disable_adapter():
            base = model(input_ids=input_ids).logits
    error = float((ours - theirs).abs().max() / theirs.abs().max())
    assert error <= 1e-5, error
    # the exported weights are the int4 ones: the source checkpoint gives other logits
    original = AutoModelForCausalLM.from_pretrained(source)
    with torch.no_grad():
        assert float((original(input_ids=input_ids).logits - base).abs().max()) > 1e-3
    assert float((theirs - base).abs().max()) > 100 * error * float(theirs.abs().max())


def test_the_byte_tokenizer_written_beside_the_base_encodes_as_training_does(tmp_path):
    packed = pack_model(save_text_model(tmp_path / "source", "qwen2"), tmp_path / "packed",
                        quant="int4", group_size=32)
    out = export_base(packed, "hf", tmp_path / "base", dtype="bfloat16")
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    ours, theirs = ByteTokenizer(VOCAB), AutoTokenizer.from_pretrained(out)
    text = MESSAGES[1]["content"] + " \n\t<|user|> ﬁ 😀"
    assert theirs.encode(text, add_special_tokens=False) == ours.encode(text)
    assert theirs.decode(ours.encode(text)) == text
    rendered = theirs.apply_chat_template(MESSAGES[:2], tokenize=True, return_dict=True)
    assert rendered["input_ids"] == ours.apply_chat_template(MESSAGES[:2])
    assert (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id) == (256, 257, 258)


def test_a_model_with_a_small_vocabulary_gets_no_byte_tokenizer(tmp_path):
    source = tmp_path / "source"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny_config("llama"))) \
        .save_pretrained(source)
    packed = pack_model(source, tmp_path / "packed", quant="int8", group_size=32)
    out = export_base(packed, "hf", tmp_path / "base")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


def test_exports_that_cannot_be_written_are_refused_before_packing(tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.setenv("MEBP_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["export-base", "preset:gemma3-1b", "--format", "gguf",
                 "--out", str(tmp_path / "g.gguf")]) == 2
    assert "covers llama, qwen2, qwen3" in capsys.readouterr().err
    assert main(["export-base", "preset:tiny", "--format", "gguf", "--dtype", "bfloat16",
                 "--out", str(tmp_path / "t.gguf")]) == 2
    assert "float32 or float16, not bfloat16" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()  # refused from the config: nothing was packed
    assert not list(tmp_path.glob("*.gguf"))
    assert main(["export-base", str(tmp_path / "missing"), "--format", "hf"]) == 2
    assert "missing/config.json" in capsys.readouterr().err


def test_an_unknown_format_is_refused(tmp_path):
    packed = pack_model(save_text_model(tmp_path / "source", "qwen2"), tmp_path / "packed",
                        quant="int4", group_size=32)
    with pytest.raises(BaseExportError, match="unknown base format 'onnx'"):
        export_base(packed, "onnx", tmp_path / "out")
    assert not (tmp_path / "out").exists()
