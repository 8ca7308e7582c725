from __future__ import annotations

import math

import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from mebp_core.lora.init import compute_init_bound, init_lora_weights


class TwoProjections(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.q_proj = nn.Linear(in_features, out_features, bias=False)
        self.v_proj = nn.Linear(in_features, out_features, bias=False)


def test_same_seed_and_path_give_same_values_any_order():
    first = init_lora_weights(4, 32, 16, seed=1, path="model.layers.0.self_attn.q_proj")
    _ = init_lora_weights(4, 32, 16, seed=1, path="model.layers.1.self_attn.q_proj")
    again = init_lora_weights(4, 32, 16, seed=1, path="model.layers.0.self_attn.q_proj")
    assert torch.equal(first[0], again[0])
    other_path = init_lora_weights(4, 32, 16, seed=1, path="model.layers.1.self_attn.q_proj")
    other_seed = init_lora_weights(4, 32, 16, seed=2, path="model.layers.0.self_attn.q_proj")
    assert not torch.equal(first[0], other_path[0])
    assert not torch.equal(first[0], other_seed[0])


def test_shapes_dtypes_and_zero_b():
    lora_a, lora_b = init_lora_weights(8, 48, 24, seed=0, path="p")
    assert lora_a.shape == (8, 48) and lora_b.shape == (24, 8)
    assert lora_a.dtype == lora_b.dtype == torch.float32
    assert torch.count_nonzero(lora_b) == 0


def test_distribution_matches_peft_default_init():
    in_features, rank = 256, 64
    torch.manual_seed(0)
    peft_model = get_peft_model(
        TwoProjections(in_features, 32), LoraConfig(r=rank, target_modules=["q_proj", "v_proj"])
    )
    peft_a = peft_model.base_model.model.q_proj.lora_A["default"].weight.detach()
    peft_b = peft_model.base_model.model.q_proj.lora_B["default"].weight.detach()
    ours_a, ours_b = init_lora_weights(rank, in_features, 32, seed=0, path="q_proj")

    bound = compute_init_bound(in_features)
    assert math.isclose(bound, 1 / math.sqrt(in_features), rel_tol=1e-12)
    # PEFT's A is U(-bound, bound) for the same bound: both fill the interval, none beyond.
    for lora_a in (peft_a, ours_a):
        assert lora_a.shape == (rank, in_features)
        assert lora_a.abs().max() <= bound
        assert lora_a.abs().max() > 0.99 * bound
        assert abs(lora_a.mean()) < 0.02 * bound
        assert math.isclose(lora_a.std().item(), bound / math.sqrt(3), rel_tol=0.02)
    assert torch.equal(peft_b, torch.zeros_like(peft_b)) and torch.equal(ours_b, peft_b)
