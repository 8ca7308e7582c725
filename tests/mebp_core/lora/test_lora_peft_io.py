from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from mebp_core.lora.peft_io import (
    AdapterError,
    check_adapter_fits,
    load_peft_adapter,
    save_peft_adapter,
)
from mebp_core.lora.spec import LoraSpec

PATHS = ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj")
SPEC = LoraSpec(rank=2, alpha=4, targets=("q", "down"))


def make_adapters(rank: int = 2, seed: int = 0) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    shapes = {PATHS[0]: (16, 16), PATHS[1]: (16, 32)}  # (out, in)
    return {
        path: (
            torch.randn(rank, n_in, generator=generator),
            torch.randn(out, rank, generator=generator),
        )
        for path, (out, n_in) in shapes.items()
    }


def test_round_trip_format_and_values(tmp_path):
    adapters = make_adapters()
    out = save_peft_adapter(tmp_path / "ad", adapters, SPEC, "org/base", model_type="llama")
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert (config["r"], config["lora_alpha"], config["lora_dropout"]) == (2, 4.0, 0.0)
    assert config["target_modules"] == ["q_proj", "down_proj"]
    assert config["base_model_name_or_path"] == "org/base" and config["inference_mode"] is True
    with safe_open(str(out / "adapter_model.safetensors"), "pt") as handle:
        assert sorted(handle.keys()) == sorted(
            f"base_model.model.{p}.lora_{s}.weight" for p in PATHS for s in "AB"
        )
        assert handle.metadata() == {"format": "pt", "model_type": "llama"}
        assert handle.get_tensor(f"base_model.model.{PATHS[1]}.lora_A.weight").shape == (2, 32)
    spec, loaded = load_peft_adapter(out)
    assert spec == SPEC
    for path, (lora_a, lora_b) in adapters.items():
        assert torch.equal(loaded[path][0], lora_a) and torch.equal(loaded[path][1], lora_b)


def test_replaces_existing_dir_only_when_complete(tmp_path):
    out = tmp_path / "ad"
    save_peft_adapter(out, make_adapters(seed=0), SPEC, None)
    first = load_peft_adapter(out)[1]
    # safetensors refuses one tensor stored under two keys: a failure inside the staging dir,
    # which must leave the previous adapter untouched.
    shared = torch.zeros(2, 16)
    broken = {PATHS[0]: (shared, torch.zeros(16, 2)), "model.x.q_proj": (shared, torch.zeros(4, 2))}
    with pytest.raises(RuntimeError, match="share memory"):
        save_peft_adapter(out, broken, SPEC, None)
    again = load_peft_adapter(out)[1]
    assert all(torch.equal(first[p][0], again[p][0]) for p in PATHS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ad"]  # no staging left behind

    save_peft_adapter(out, make_adapters(seed=1), SPEC, None)
    replaced = load_peft_adapter(out)[1]
    assert torch.equal(replaced[PATHS[0]][0], make_adapters(seed=1)[PATHS[0]][0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ad"]


def write_adapter(tmp_path, config=None, tensors=None):
    out = save_peft_adapter(tmp_path / "ad", make_adapters(), SPEC, None)
    if config is not None:
        (out / "adapter_config.json").write_text(config)
    if tensors is not None:
        save_file(tensors, str(out / "adapter_model.safetensors"))
    return out


def peft_config(**changes) -> str:
    config = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}
    return json.dumps({**config, **changes})


def test_missing_files_named(tmp_path):
    with pytest.raises(AdapterError, match="does not exist"):
        load_peft_adapter(tmp_path / "nowhere")
    out = write_adapter(tmp_path)
    (out / "adapter_model.safetensors").unlink()
    with pytest.raises(AdapterError, match="adapter_model.safetensors is missing"):
        load_peft_adapter(out)
    (out / "adapter_config.json").unlink()
    with pytest.raises(AdapterError, match="adapter_config.json is missing"):
        load_peft_adapter(out)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        (peft_config(peft_type="IA3"), "'IA3', expected 'LORA'"),
        (peft_config(use_dora=True), "use_dora"),
        (peft_config(rank_pattern={"q_proj": 4}), "rank_pattern"),
        (peft_config(r="2"), "integer 'r'"),
    ],
)
def test_bad_config_rejected(tmp_path, config, message):
    with pytest.raises(AdapterError, match=message):
        load_peft_adapter(write_adapter(tmp_path, config=config))


def test_missing_half_and_rank_mismatch_named(tmp_path):
    key = f"base_model.model.{PATHS[0]}"
    only_a = {f"{key}.lora_A.weight": torch.zeros(2, 16)}
    with pytest.raises(AdapterError, match=rf"{key}\.lora_B\.weight is missing"):
        load_peft_adapter(write_adapter(tmp_path, tensors=only_a))
    rank3 = {f"{key}.lora_A.weight": torch.zeros(3, 16), f"{key}.lora_B.weight": torch.zeros(16, 3)}
    with pytest.raises(AdapterError, match=r"q_proj has rank 3.*says r=2"):
        load_peft_adapter(write_adapter(tmp_path, tensors=rank3))
    stray = {f"{key}.lora_magnitude_vector": torch.zeros(16)}
    with pytest.raises(AdapterError, match="lora_magnitude_vector"):
        load_peft_adapter(write_adapter(tmp_path, tensors=stray))
    unknown = {
        "base_model.model.fc1.lora_A.weight": torch.zeros(2, 4),
        "base_model.model.fc1.lora_B.weight": torch.zeros(4, 2),
    }
    with pytest.raises(AdapterError, match="fc1"):
        load_peft_adapter(write_adapter(tmp_path, tensors=unknown))


def test_truncated_weights_file(tmp_path):
    out = write_adapter(tmp_path)
    (out / "adapter_model.safetensors").write_bytes(b"\x10\x00")
    with pytest.raises(AdapterError, match="not a readable safetensors"):
        load_peft_adapter(out)


def test_check_adapter_fits_names_module_and_shapes():
    adapters = make_adapters()
    shapes = {PATHS[0]: (16, 16), PATHS[1]: (16, 32)}
    check_adapter_fits(adapters, shapes)
    with pytest.raises(AdapterError, match=r"down_proj does not fit.*out=16, in=64.*\(2, 32\)"):
        check_adapter_fits(adapters, {**shapes, PATHS[1]: (16, 64)})
    with pytest.raises(AdapterError, match=r"q_proj does not exist"):
        check_adapter_fits(adapters, {PATHS[1]: (16, 32)})
