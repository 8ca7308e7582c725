from __future__ import annotations

import pytest
import torch

from mebp_core.store.errors import PackError
from mebp_core.store.format import FORMAT_VERSION, STORE_FILENAME
from mebp_core.store.preset_configs import list_presets, preset_config
from mebp_core.store.presets import (
    iter_preset_tensors,
    load_preset_tensor,
    preset_parameter_count,
    save_preset_as_hf,
)
from mebp_core.store.reader import open_store
from mebp_core.store.resolve import resolve_model
from mebp_core.store.shapes import expected_shapes

# Published sizes (text model, embeddings counted once when tied).
EXPECTED_PARAMS_M = {
    "qwen2.5-0.5b": 494.0,
    "qwen2.5-1.5b": 1543.7,
    "qwen2.5-3b": 3085.9,
    "gemma3-1b": 999.9,
    "gemma3-4b": 3880.3,
    "llama3.2-1b": 1235.8,
    "smollm2-135m": 134.5,
    "qwen3-0.6b": 596.0,
}


def test_required_presets_exist():
    assert set(EXPECTED_PARAMS_M) | {"tiny", "pycode-12m"} == set(list_presets())


@pytest.mark.parametrize("name", sorted(EXPECTED_PARAMS_M))
def test_parameter_counts_match_the_published_models(name):
    assert preset_parameter_count(name) / 1e6 == pytest.approx(EXPECTED_PARAMS_M[name], abs=0.1)


@pytest.mark.parametrize("name", list_presets())
def test_transformers_builds_the_same_tensors_from_the_config(name):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = preset_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    state = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    assert state == expected_shapes(config)


def test_preset_facts():
    gemma = preset_config("gemma3-4b")
    assert gemma["model_type"] == "gemma3_text" and gemma["sliding_window"] == 1024
    assert gemma["layer_types"][:6] == ["sliding_attention"] * 5 + ["full_attention"]
    assert preset_config("llama3.2-1b")["rope_scaling"]["rope_type"] == "llama3"
    tiny = preset_config("tiny")
    assert tiny["vocab_size"] >= 256 and tiny["tie_word_embeddings"]
    assert 1e6 < preset_parameter_count("tiny") < 10e6


def test_synthetic_weights_are_deterministic_and_order_independent():
    first = dict(iter_preset_tensors("tiny"))  # tiny tensors fit one chunk each
    again = dict(iter_preset_tensors("tiny"))
    assert first.keys() == again.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    name = "model.layers.2.mlp.up_proj.weight"
    assert torch.equal(load_preset_tensor("tiny", name), first[name])
    assert float(first[name].std()) == pytest.approx(0.02, rel=0.05)
    assert not torch.equal(first[name], first["model.layers.1.mlp.up_proj.weight"])
    assert torch.equal(first["model.norm.weight"], torch.ones(256))
    assert float(load_preset_tensor("gemma3-1b", "model.norm.weight").abs().max()) < 0.2


def test_big_tensors_stream_in_row_chunks():
    chunks = []
    for name, chunk in iter_preset_tensors("smollm2-135m"):
        if name != "model.embed_tokens.weight":
            break
        chunks.append(chunk.shape)
    assert len(chunks) > 1 and sum(c[0] for c in chunks) == 49152


def test_tiny_packs_and_saves_as_a_loadable_hf_model(tmp_path):
    from transformers import AutoModelForCausalLM

    hf_dir = save_preset_as_hf("tiny", tmp_path / "hf", max_shard_nbytes=4 << 20)
    assert (hf_dir / "model.safetensors.index.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(hf_dir)
    embed = load_preset_tensor("tiny", "model.embed_tokens.weight")
    assert torch.equal(model.model.embed_tokens.weight, embed)
    with open_store(resolve_model("preset:tiny", "none", cache_dir=tmp_path / "c")) as store:
        assert torch.equal(store.dequantize("model.embed_tokens.weight"), embed)
        q_proj = "model.layers.3.self_attn.q_proj.weight"
        assert torch.equal(store.dequantize(q_proj), model.state_dict()[q_proj])


def test_resolve_model_packs_once_and_reuses(tmp_path, monkeypatch):
    monkeypatch.setenv("MEBP_CACHE_DIR", str(tmp_path / "cache"))
    first = resolve_model("preset:tiny", quant="int4", group_size=64)
    assert first.parent == tmp_path / "cache"
    assert first.name == f"preset-tiny-int4-g64-v{FORMAT_VERSION}"
    mtime_ns = (first / STORE_FILENAME).stat().st_mtime_ns
    assert resolve_model("preset:tiny") == first
    assert (first / STORE_FILENAME).stat().st_mtime_ns == mtime_ns  # reused, not repacked
    assert resolve_model("preset:tiny", quant="int8") != first
    assert resolve_model(first) == first  # a packed dir is used as is
    hf_dir = save_preset_as_hf("tiny", tmp_path / "hf")
    from_hf = resolve_model(hf_dir, quant="int8")
    assert from_hf.parent == tmp_path / "cache" and from_hf.name.endswith("-int8-g64-v1")
    with pytest.raises(PackError, match="unknown preset"):
        resolve_model("preset:gpt5")


def test_packing_in_a_child_reports_its_progress_and_its_errors(tmp_path):
    """The worker packs in a child process (its memory never the caller's): every tensor
    written is reported back as it goes, and a failure is raised here with its own type."""
    seen = []
    packed = resolve_model("preset:tiny", cache_dir=tmp_path, isolated=True,
                           progress=lambda done, total, name: seen.append((done, total, name)))
    with open_store(packed) as store:
        names = set(store.names())
    total = seen[-1][1]
    assert [done for done, _, _ in seen] == list(range(1, total + 1))
    assert {name for _, _, name in seen} == names
    broken = save_preset_as_hf("tiny", tmp_path / "hf")
    (broken / "config.json").write_text("{not json")
    with pytest.raises(PackError):
        resolve_model(broken, cache_dir=tmp_path, isolated=True)
