"""MLX export: mlx-lm itself loads the adapter and matches transformers + PEFT in float32."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from peft import PeftModel
from safetensors.numpy import load_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from mebp_core.lora.export import export_adapter, linear_shapes
from mebp_core.lora.peft_io import save_peft_adapter
from mebp_core.lora.spec import LoraSpec
from mebp_core.store.presets import save_preset_as_hf

mx = pytest.importorskip("mlx.core", reason="mlx[cpu] is not installed")
mlx_lm = pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")

SPEC = LoraSpec(rank=4, alpha=8, targets="all")


def random_adapters(shapes, rank: int, paths, seed: int = 0) -> dict:
    """Non-zero A (r, in) and B (out, r) for each module path, so the adapter shows."""
    generator = torch.Generator().manual_seed(seed)
    return {
        path: (
            torch.randn(rank, shapes[path][1], generator=generator) * 0.1,
            torch.randn(shapes[path][0], rank, generator=generator) * 0.1,
        )
        for path in paths
    }


def add_word_tokenizer(model_dir: Path, vocab_size: int) -> None:
    """mlx-lm's ``load`` wants a tokenizer beside the weights; any one will do here."""
    vocab = {f"t{i}": i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0").save_pretrained(model_dir)


def lift_rope_theta(model_dir: Path) -> None:
    """mlx-lm 0.32 reads a top-level ``rope_theta`` only (its qwen2 defaults to 1e6), while
    transformers 5 saves it under ``rope_parameters``: copy it up, same value."""
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:
        path.write_text(json.dumps({**config, "rope_theta": rope["rope_theta"]}, indent=2))


def convert_to_mlx(hf_dir: Path, out: Path) -> Path:
    add_word_tokenizer(hf_dir, json.loads((hf_dir / "config.json").read_text())["vocab_size"])
    lift_rope_theta(hf_dir)
    mlx_lm.convert(str(hf_dir), str(out), dtype="float32")
    return out


def mlx_logits(mlx_dir: Path, adapter_dir: Path, input_ids: torch.Tensor) -> np.ndarray:
    model, _ = mlx_lm.load(str(mlx_dir), adapter_path=str(adapter_dir))
    logits = model(mx.array(input_ids.numpy()))
    return np.array(logits.astype(mx.float32))


def peft_logits(hf_dir: Path, peft_dir: Path, input_ids: torch.Tensor) -> tuple[np.ndarray, ...]:
    """(base logits, base + adapter logits) from transformers and PEFT."""
    base = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        plain = base(input_ids=input_ids).logits.numpy()
        adapted = PeftModel.from_pretrained(base, peft_dir).eval()(input_ids=input_ids)
    return plain, adapted.logits.numpy()


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


def check_parity(hf_dir: Path, adapters: dict, spec: LoraSpec, tmp_path: Path) -> None:
    config = json.loads((hf_dir / "config.json").read_text())
    peft_dir = save_peft_adapter(tmp_path / "peft", adapters, spec, str(hf_dir))
    out = export_adapter(peft_dir, "mlx", tmp_path / "mlx_adapter", base_config=config)
    mlx_dir = convert_to_mlx(hf_dir, tmp_path / "mlx_model")
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, config["vocab_size"], (1, 16), generator=generator)
    plain, want = peft_logits(hf_dir, peft_dir, input_ids)
    got = mlx_logits(mlx_dir, out, input_ids)
    assert rel_err(got, want) <= 1e-4  # measured ~2e-6
    assert rel_err(plain, want) > 1e-2  # the adapter changes the output


@pytest.mark.slow
def test_mlx_lm_matches_peft_on_tiny_preset(tmp_path):
    hf_dir = save_preset_as_hf("tiny", tmp_path / "hf")
    shapes = linear_shapes(json.loads((hf_dir / "config.json").read_text()))
    paths = SPEC.target_module_paths(shapes)
    check_parity(hf_dir, random_adapters(shapes, SPEC.rank, paths), SPEC, tmp_path)


@pytest.mark.slow
def test_mlx_lm_matches_peft_on_tiny_families(tiny_model_dir, tmp_path):
    hf_dir = Path(shutil.copytree(tiny_model_dir, tmp_path / "hf"))
    shapes = linear_shapes(json.loads((hf_dir / "config.json").read_text()))
    spec = LoraSpec(rank=4, alpha=16, targets="all", use_rslora=True)
    paths = spec.target_module_paths(shapes)
    check_parity(hf_dir, random_adapters(shapes, spec.rank, paths), spec, tmp_path)


@pytest.mark.slow
def test_mlx_lm_matches_peft_on_partial_adapter(tmp_path):
    """q and v of the last layer and q of layer 2: mlx-lm gets zeros for layer 2's v."""
    hf_dir = save_preset_as_hf("tiny", tmp_path / "hf")
    shapes = linear_shapes(json.loads((hf_dir / "config.json").read_text()))
    spec = LoraSpec(rank=2, alpha=4, targets="q,v")
    paths = ["model.layers.2.self_attn.q_proj", *spec.target_module_paths(shapes)[-2:]]
    check_parity(hf_dir, random_adapters(shapes, spec.rank, paths, seed=3), spec, tmp_path)


def test_mlx_files_follow_mlx_lm_layout(tmp_path):
    config = json.loads((save_preset_as_hf("tiny", tmp_path / "hf") / "config.json").read_text())
    shapes = linear_shapes(config)
    paths = ["model.layers.2.self_attn.q_proj", "model.layers.3.mlp.down_proj"]
    adapters = random_adapters(shapes, 4, paths)
    spec = LoraSpec(rank=4, alpha=8, targets="q,down")
    peft_dir = save_peft_adapter(tmp_path / "peft", adapters, spec, None)
    out = export_adapter(peft_dir, "mlx", tmp_path / "mlx", base_config=config)

    assert json.loads((out / "adapter_config.json").read_text()) == {
        "fine_tune_type": "lora",
        "num_layers": 2,
        "lora_parameters": {
            "rank": 4,
            "scale": 2.0,
            "dropout": 0.0,
            "keys": ["mlp.down_proj", "self_attn.q_proj"],
        },
    }
    tensors = load_file(out / "adapters.safetensors")
    assert len(tensors) == 2 * 2 * 2  # layers 2-3 x (q, down) x (a, b)
    for path in paths:
        lora_a, lora_b = adapters[path]
        assert np.array_equal(tensors[path + ".lora_a"], lora_a.numpy().T)  # (in, r)
        assert np.array_equal(tensors[path + ".lora_b"], lora_b.numpy().T)  # (r, out)
    assert not tensors["model.layers.2.mlp.down_proj.lora_b"].any()
    assert tensors["model.layers.3.self_attn.q_proj.lora_a"].shape == (256, 4)
    assert all(t.dtype == np.float32 for t in tensors.values())
