from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from mebp_core.models import UnknownArchitectureError
from mebp_core.store.errors import PackError
from mebp_core.store.pack import pack_model
from mebp_core.store.reader import open_store


def assert_matches_source(store, state: dict[str, torch.Tensor], quant: str) -> None:
    assert sorted(store.names()) == sorted(state)
    for name, w in state.items():
        info = store.info(name)
        assert info.shape == tuple(w.shape) and info.dtype == w.dtype
        approx = store.dequantize(name, w.dtype)
        assert approx.dtype == w.dtype
        if info.bits is None:
            assert quant == "none" or w.dim() == 1 or w.shape[-1] % store.group_size
            assert torch.equal(approx, w), name
            continue
        assert info.bits == {"int8": 8, "int4": 4}[quant] and w.dim() == 2
        n, k = w.shape
        scale = store.raw(name).scales.float()[..., None]  # (N, G, 1)
        approx = store.dequantize(name, torch.float32)
        err = (approx - w.float()).abs().view(n, k // store.group_size, -1)
        slack = 1e-6 * float(w.abs().max())
        assert bool((err <= scale / 2 + slack).all()), name


@pytest.mark.parametrize("quant", ["none", "int8", "int4"])
@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("model_type", ["llama", "qwen2", "gemma3_text"])
def test_every_tensor_round_trips(hf_models, tmp_path, model_type, sharded, quant):
    src, state = hf_models(model_type, sharded)
    assert (src / "model.safetensors.index.json").is_file() == sharded
    packed = pack_model(src, tmp_path / "packed", quant=quant, group_size=32)
    with open_store(packed) as store:
        assert store.quant == quant and store.group_size == 32
        assert store.config == json.loads((src / "config.json").read_text())
        assert_matches_source(store, state, quant)
        assert ("lm_head.weight" in store) == (model_type != "gemma3_text")  # tied for gemma


def test_bfloat16_source_is_kept_bit_exact_without_quantization(hf_models, tmp_path):
    src, state = hf_models("llama", dtype=torch.bfloat16)
    with open_store(pack_model(src, tmp_path / "packed", quant="none")) as store:
        assert_matches_source(store, state, "none")
    with open_store(pack_model(src, tmp_path / "packed4", quant="int4")) as store:
        assert_matches_source(store, state, "int4")


def test_copies_tokenizer_files_and_reports_progress(hf_models, tmp_path):
    src, state = hf_models("qwen2")
    (src / "tokenizer_config.json").write_text('{"model_max_length": 128}')
    calls = []
    packed = pack_model(src, tmp_path / "p", progress=lambda *a: calls.append(a))
    assert (packed / "tokenizer_config.json").read_text() == '{"model_max_length": 128}'
    assert [c[0] for c in calls] == list(range(1, len(state) + 1))
    assert {c[1] for c in calls} == {len(state)} and {c[2] for c in calls} == set(state)


def copy_dir(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def assert_fails_cleanly(src, tmp_path, match, error=PackError):
    out_parent = tmp_path / "out"
    out_parent.mkdir()
    with pytest.raises(error, match=match):
        pack_model(src, out_parent / "packed")
    assert list(out_parent.iterdir()) == []  # neither the output nor a temp dir is left


def test_truncated_safetensors_is_named_and_leaves_nothing(hf_models, tmp_path):
    src = copy_dir(hf_models("llama", sharded=True)[0], tmp_path / "src")
    shard = sorted(src.glob("model-*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:-100])
    assert_fails_cleanly(src, tmp_path, rf"{shard.name}: truncated safetensors")


def test_missing_shard_is_named_and_leaves_nothing(hf_models, tmp_path):
    src = copy_dir(hf_models("llama", sharded=True)[0], tmp_path / "src")
    shard = sorted(src.glob("model-*.safetensors"))[0]
    shard.unlink()
    assert_fails_cleanly(src, tmp_path, rf"{shard.name}: shard listed .* is missing")


def test_missing_config_or_weights(hf_models, tmp_path):
    src = copy_dir(hf_models("qwen2")[0], tmp_path / "src")
    (src / "model.safetensors").unlink()
    assert_fails_cleanly(src, tmp_path, "no safetensors")
    (src / "config.json").unlink()
    with pytest.raises(PackError, match=r"config\.json: missing"):
        pack_model(src, tmp_path / "p2")


def test_shape_that_contradicts_config(hf_models, tmp_path):
    src = copy_dir(hf_models("qwen2")[0], tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "intermediate_size": 192}))
    assert_fails_cleanly(src, tmp_path, r"model\.safetensors: tensor 'model.layers.0.mlp.gate")


def test_unknown_architecture_and_preset(hf_models, tmp_path):
    src = copy_dir(hf_models("qwen2")[0], tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "model_type": "mamba"}))
    assert_fails_cleanly(src, tmp_path, "mamba", error=UnknownArchitectureError)
    with pytest.raises(PackError, match="unknown preset 'nope'.*qwen2.5-0.5b.*tiny"):
        pack_model("preset:nope", tmp_path / "p")


def test_repacking_replaces_a_packed_dir_but_not_other_dirs(hf_models, tmp_path):
    src, state = hf_models("qwen2")
    out = pack_model(src, tmp_path / "p", quant="int4")
    pack_model(src, out, quant="none")
    with open_store(out) as store:
        assert store.quant == "none"
    other = tmp_path / "precious"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    with pytest.raises(PackError, match="not a packed model"):
        pack_model(src, other)
    assert [f.name for f in tmp_path.iterdir() if f.name.startswith(".")] == []


@pytest.mark.parametrize("layout", ["model.language_model.", "language_model.model."])
def test_multimodal_gemma3_packs_the_text_part(hf_models, tmp_path, layout):
    text_src, state = hf_models("gemma3_text")
    text_config = json.loads((text_src / "config.json").read_text())
    src = tmp_path / "mm"
    src.mkdir()
    tensors = {layout + k.removeprefix("model."): v for k, v in state.items()}
    tensors["model.vision_tower.vision_model.embeddings.patch_embedding.weight"] = torch.ones(4, 3)
    save_file(tensors, src / "model.safetensors")
    config = {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": text_config,
        "vision_config": {"hidden_size": 4},
    }
    (src / "config.json").write_text(json.dumps(config))
    with open_store(pack_model(src, tmp_path / "p", quant="none")) as store:
        assert_matches_source(store, state, "none")
        assert store.name_prefix_map == {"model.": layout}
        assert store.config["model_type"] == "gemma3"
        assert store.header["skipped_tensors"] == [
            "model.vision_tower.vision_model.embeddings.patch_embedding.weight"
        ]


@pytest.mark.parametrize("group_size", [4, 6, 12, 9, 8192])
def test_a_group_size_that_is_not_a_power_of_two_from_8_to_4096_is_refused(tmp_path,
                                                                           group_size):
    """The rule training and the service hold (mebp_core/store/groups.py), not just "even"."""
    with pytest.raises(PackError, match="group_size must be a power of two from 8 to 4096"):
        pack_model("preset:tiny", tmp_path / "packed", group_size=group_size)
    assert list(tmp_path.iterdir()) == []
