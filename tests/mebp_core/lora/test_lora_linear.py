from __future__ import annotations

import pytest
import torch
from torch import nn

from mebp_core.lora.linear import (
    LoraLinear,
    LoraTargetError,
    apply_lora,
    assign_lora_tensors,
    collect_lora_tensors,
    lora_parameters,
)
from mebp_core.lora.peft_io import AdapterError
from mebp_core.lora.spec import LoraSpec


def test_apply_lora_wraps_targets_by_path(tiny_model_dir, load_tiny_model, token_batch):
    model = load_tiny_model(tiny_model_dir)
    logits_before = model(input_ids=token_batch["input_ids"]).logits
    spec = LoraSpec(rank=4, alpha=8, targets=("q", "v", "down"))
    adapted = apply_lora(model, spec, seed=0)

    assert sorted(adapted) == sorted(
        f"model.layers.{i}.{s}" for i in range(2) for s in spec.module_suffixes()
    )
    for path, module in adapted.items():
        assert model.get_submodule(path) is module and isinstance(module.base, nn.Linear)
        assert module.lora_A.weight.shape == (4, module.base.in_features)
        assert module.lora_B.weight.shape == (module.base.out_features, 4)
        assert module.scaling == 2.0
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert len(trainable) == len(lora_parameters(adapted)) == 12
    assert all(".lora_A.weight" in n or ".lora_B.weight" in n for n in trainable)
    # B starts at zero, so the adapted model computes exactly what the base model did.
    assert torch.equal(model(input_ids=token_batch["input_ids"]).logits, logits_before)


def test_init_does_not_depend_on_which_targets(tiny_model_dir, load_tiny_model):
    few = apply_lora(load_tiny_model(tiny_model_dir), LoraSpec(rank=4, targets="v"), seed=3)
    many = apply_lora(load_tiny_model(tiny_model_dir), LoraSpec(rank=4), seed=3)
    for path, module in few.items():
        assert torch.equal(module.lora_A.weight, many[path].lora_A.weight)


def test_lora_linear_grads_match_plain_autograd():
    torch.manual_seed(0)
    base = nn.Linear(16, 12)
    lora_a, lora_b = torch.randn(3, 16), torch.randn(12, 3)
    layer = LoraLinear(base, lora_a, lora_b, scaling=1.5)
    x = torch.randn(2, 5, 16, requires_grad=True)
    layer(x).square().sum().backward()

    a_ref, b_ref = lora_a.clone().requires_grad_(True), lora_b.clone().requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    y_ref = base(x_ref) + (x_ref @ a_ref.T) @ b_ref.T * 1.5
    y_ref.square().sum().backward()
    for got, want in ((x.grad, x_ref.grad), (layer.lora_A.weight.grad, a_ref.grad)):
        assert ((got - want).abs().max() / want.abs().max()).item() <= 1e-6
    got_b = layer.lora_B.weight.grad
    assert ((got_b - b_ref.grad).abs().max() / b_ref.grad.abs().max()).item() <= 1e-6


def test_bfloat16_base_keeps_float32_masters():
    base = nn.Linear(16, 8).to(torch.bfloat16)
    layer = LoraLinear(base, torch.randn(2, 16), torch.randn(8, 2), scaling=1.0)
    y = layer(torch.randn(3, 16, dtype=torch.bfloat16))
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16
    assert layer.lora_A.weight.grad.dtype == layer.lora_B.weight.grad.dtype == torch.float32


def test_parameterless_base_module_with_sizes():
    class Frozen(nn.Module):  # stands in for the engine's lazily decompressed projection
        in_features, out_features = 6, 4

        def forward(self, x):
            return torch.zeros(*x.shape[:-1], 4)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = nn.Module()
            self.mlp.up_proj = Frozen()

    model = nn.Module()
    model.layers = nn.ModuleList([Block()])
    adapted = apply_lora(model, LoraSpec(rank=2, targets="up"), seed=0)
    assert list(adapted) == ["layers.0.mlp.up_proj"]
    assert adapted["layers.0.mlp.up_proj"](torch.ones(5, 6)).shape == (5, 4)


def test_errors_no_target_and_double_wrap(tiny_model_dir, load_tiny_model):
    with pytest.raises(LoraTargetError, match="q_proj"):
        apply_lora(nn.Sequential(nn.Linear(2, 2)), LoraSpec(rank=1, targets="q"), seed=0)
    model = load_tiny_model(tiny_model_dir)
    apply_lora(model, LoraSpec(rank=2, targets="q"), seed=0)
    with pytest.raises(LoraTargetError, match="already"):
        apply_lora(model, LoraSpec(rank=2, targets="q"), seed=0)


def test_assign_checks_fit_before_copying(tiny_model_dir, load_tiny_model):
    adapted = apply_lora(load_tiny_model(tiny_model_dir), LoraSpec(rank=2, targets="q"), seed=0)
    tensors = collect_lora_tensors(adapted)
    path = "model.layers.0.self_attn.q_proj"
    new = {p: (a + 1, b + 1) for p, (a, b) in tensors.items()}
    assign_lora_tensors(adapted, new)
    assert torch.equal(adapted[path].lora_B.weight, new[path][1])
    with pytest.raises(AdapterError, match=r"q_proj.*out=64, in=64"):
        assign_lora_tensors(adapted, {path: (torch.zeros(2, 32), torch.zeros(64, 2))})
