"""Export refuses bad input with an ``AdapterError`` and leaves existing exports untouched."""

from __future__ import annotations

import pytest
import torch

from mebp_core.lora.export import export_adapter, linear_shapes
from mebp_core.lora.export_gguf import write_gguf_adapter
from mebp_core.lora.peft_io import AdapterError, save_peft_adapter
from mebp_core.lora.spec import LoraSpec
from mebp_core.store.preset_configs import preset_config

SPEC = LoraSpec(rank=2, alpha=4, targets="q")
Q0 = "model.layers.0.self_attn.q_proj"


def constant_pair(out_features: int, in_features: int, rank: int = 2):
    return torch.zeros(rank, in_features), torch.ones(out_features, rank)


@pytest.fixture
def tiny_config() -> dict:
    return preset_config("tiny")


@pytest.fixture
def peft_dir(tmp_path, tiny_config):
    out_features, in_features = linear_shapes(tiny_config)[Q0]
    adapters = {Q0: constant_pair(out_features, in_features)}
    return save_peft_adapter(tmp_path / "peft", adapters, SPEC, None)


def leftovers(directory) -> list[str]:
    return [p.name for p in directory.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_unknown_format_is_refused(peft_dir, tmp_path, tiny_config):
    with pytest.raises(AdapterError, match="unknown export format 'onnx'.*peft, mlx, gguf"):
        export_adapter(peft_dir, "onnx", tmp_path / "out", base_config=tiny_config)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt", ["peft", "mlx", "gguf"])
def test_missing_adapter_is_refused(tmp_path, tiny_config, fmt):
    with pytest.raises(AdapterError, match="does not exist"):
        export_adapter(tmp_path / "nowhere", fmt, tmp_path / "out", base_config=tiny_config)
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdapterError, match="adapter_config.json is missing"):
        export_adapter(tmp_path / "empty", fmt, tmp_path / "out", base_config=tiny_config)


def test_module_without_gguf_name_is_refused(tmp_path, tiny_config):
    """A Qwen2-MoE style shared expert: llama.cpp's qwen2 architecture has no such tensor."""
    path = "model.layers.0.mlp.shared_expert.up_proj"
    adapters = {path: constant_pair(768, 256)}
    config = {**tiny_config, "num_hidden_layers": 4}
    with pytest.raises(AdapterError, match="shared_expert.up_proj has no GGUF tensor name"):
        write_gguf_adapter(tmp_path / "a.gguf", SPEC, adapters, config)
    assert not (tmp_path / "a.gguf").exists() and not leftovers(tmp_path)

    # Through the dispatcher the base model check already names the module.
    peft_dir = save_peft_adapter(tmp_path / "peft", adapters, LoraSpec(rank=2, targets="up"), None)
    with pytest.raises(AdapterError, match="shared_expert.up_proj does not exist in the model"):
        export_adapter(peft_dir, "gguf", tmp_path / "a.gguf", base_config=tiny_config)


def test_unsupported_base_architecture_is_refused(peft_dir, tmp_path):
    config = {"model_type": "phi3", "num_hidden_layers": 2}
    with pytest.raises(AdapterError, match="model_type 'phi3' is not supported"):
        export_adapter(peft_dir, "gguf", tmp_path / "a.gguf", base_config=config)


@pytest.mark.parametrize("fmt", ["peft", "mlx", "gguf"])
def test_adapter_for_another_model_keeps_the_old_export(peft_dir, tmp_path, tiny_config, fmt):
    out = export_adapter(peft_dir, fmt, tmp_path / f"out.{fmt}", base_config=tiny_config)
    before = sorted(p.read_bytes() for p in ([out] if out.is_file() else out.iterdir()))
    wider = {**tiny_config, "hidden_size": 512}
    with pytest.raises(AdapterError, match=f"{Q0} does not fit"):
        export_adapter(peft_dir, fmt, out, base_config=wider)
    after = sorted(p.read_bytes() for p in ([out] if out.is_file() else out.iterdir()))
    assert after == before and not leftovers(tmp_path)


@pytest.mark.parametrize("fmt", ["peft", "mlx", "gguf"])
def test_export_replaces_an_existing_one(peft_dir, tmp_path, tiny_config, fmt):
    out = tmp_path / f"out.{fmt}"
    export_adapter(peft_dir, fmt, out, base_config=tiny_config)
    assert export_adapter(peft_dir, fmt, out, base_config=tiny_config) == out
    assert not leftovers(tmp_path)


def test_peft_export_is_a_byte_copy(peft_dir, tmp_path, tiny_config):
    out = export_adapter(peft_dir, "peft", tmp_path / "copy", base_config=tiny_config)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in peft_dir.iterdir())
    for path in peft_dir.iterdir():
        assert (out / path.name).read_bytes() == path.read_bytes()
