"""GGUF export, read back with gguf's own reader: every key, name, dtype, shape and value."""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
import torch

from mebp_core.lora.export import export_adapter, linear_shapes
from mebp_core.lora.peft_io import save_peft_adapter
from mebp_core.lora.spec import LoraSpec
from mebp_core.store.preset_configs import preset_config

# llama.cpp's names for the HF modules (convert_hf_to_gguf.py's tensor map).
GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
# preset -> general.architecture; small presets, one per GGUF architecture.
PRESET_ARCHITECTURES = {
    "smollm2-135m": "llama",
    "tiny": "qwen2",
    "qwen3-0.6b": "qwen3",
    "gemma3-1b": "gemma3",
}


def random_adapters(shapes, rank: int, paths, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {
        path: (
            torch.randn(rank, shapes[path][1], generator=generator),
            torch.randn(shapes[path][0], rank, generator=generator),
        )
        for path in paths
    }


def llama_cpp_row_order(out_features: int, n_head: int) -> np.ndarray:
    """Row order of convert_hf_to_gguf's ``LlamaModel.permute`` (HF rotate-half -> interleaved)."""
    rows = np.arange(out_features).reshape(n_head, 2, out_features // n_head // 2)
    return rows.swapaxes(1, 2).reshape(-1)


def head_count(path: str, config: dict) -> int:
    key = "num_attention_heads" if path.endswith("q_proj") else "num_key_value_heads"
    return config[key]


def expected_lora_b(path: str, lora_b: torch.Tensor, config: dict, arch: str) -> np.ndarray:
    b = lora_b.numpy()
    if arch != "llama" or not path.endswith(("q_proj", "k_proj")):
        return b
    return b[llama_cpp_row_order(b.shape[0], head_count(path, config))]


def gguf_name(path: str) -> str:
    _, _, layer, rest = path.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES[rest]}.weight"


def export_gguf(tmp_path, preset: str, spec: LoraSpec, paths=None):
    config = preset_config(preset)
    shapes = linear_shapes(config)
    adapters = random_adapters(shapes, spec.rank, paths or spec.target_module_paths(shapes))
    peft_dir = save_peft_adapter(tmp_path / "peft", adapters, spec, None)
    out = export_adapter(peft_dir, "gguf", tmp_path / "adapter.gguf", base_config=config)
    return config, adapters, gguf.GGUFReader(out)


def field_values(reader: gguf.GGUFReader) -> dict:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


@pytest.mark.parametrize("preset", sorted(PRESET_ARCHITECTURES))
def test_gguf_holds_every_peft_tensor(tmp_path, preset):
    spec = LoraSpec(rank=2, alpha=8, targets="all")
    config, adapters, reader = export_gguf(tmp_path, preset, spec)
    arch = PRESET_ARCHITECTURES[preset]

    assert field_values(reader) == {
        "general.architecture": arch,
        "general.type": "adapter",
        "adapter.type": "lora",
        "adapter.lora.alpha": 8.0,
    }
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 2 * 7 * config["num_hidden_layers"] == 2 * len(adapters)
    for path, (lora_a, lora_b) in adapters.items():
        a, b = tensors[gguf_name(path) + ".lora_a"], tensors[gguf_name(path) + ".lora_b"]
        assert a.tensor_type == b.tensor_type == gguf.GGMLQuantizationType.F32
        # GGUF shapes are ggml's ne (fastest dim first): what llama.cpp checks against the base.
        assert list(a.shape) == [lora_a.shape[1], spec.rank]
        assert list(b.shape) == [spec.rank, lora_b.shape[0]]
        assert np.array_equal(a.data, lora_a.numpy())  # (r, in)
        assert np.array_equal(b.data, expected_lora_b(path, lora_b, config, arch))  # (out, r)


def test_llama_q_k_delta_is_the_base_weight_permutation(tmp_path):
    """llama.cpp permutes q/k base weights: B'A must equal the same permutation of BA."""
    spec = LoraSpec(rank=2, alpha=8, targets="q,k,v")
    config, adapters, reader = export_gguf(tmp_path, "smollm2-135m", spec)
    tensors = {t.name: t.data for t in reader.tensors}
    for path, (lora_a, lora_b) in adapters.items():
        delta = tensors[gguf_name(path) + ".lora_b"] @ tensors[gguf_name(path) + ".lora_a"]
        want = (lora_b @ lora_a).numpy()
        if not path.endswith("v_proj"):
            want = want[llama_cpp_row_order(want.shape[0], head_count(path, config))]
            assert not np.array_equal(delta, (lora_b @ lora_a).numpy())
        np.testing.assert_allclose(delta, want, rtol=1e-6, atol=1e-6)


def test_gguf_alpha_keeps_rslora_scaling(tmp_path):
    """llama.cpp scales by alpha / r: rsLoRA's alpha / sqrt(r) needs alpha * sqrt(r) there."""
    spec = LoraSpec(rank=4, alpha=8, targets="q", use_rslora=True)
    _, _, reader = export_gguf(tmp_path, "tiny", spec)
    alpha = field_values(reader)["adapter.lora.alpha"]
    assert alpha / spec.rank == pytest.approx(spec.scaling) == 8 / math.sqrt(4)


def test_gguf_of_a_partial_adapter_has_only_its_modules(tmp_path):
    paths = ["model.layers.1.mlp.up_proj", "model.layers.3.self_attn.o_proj"]
    spec = LoraSpec(rank=3, alpha=6, targets="up,o")
    _, _, reader = export_gguf(tmp_path, "tiny", spec, paths)
    assert sorted(t.name for t in reader.tensors) == [
        "blk.1.ffn_up.weight.lora_a",
        "blk.1.ffn_up.weight.lora_b",
        "blk.3.attn_output.weight.lora_a",
        "blk.3.attn_output.weight.lora_b",
    ]
