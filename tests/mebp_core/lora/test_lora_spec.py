from __future__ import annotations

import math

import pytest
from peft import LoraConfig
from pydantic import ValidationError

from mebp_core.lora.spec import LoraSpec

ALL = ("q", "k", "v", "o", "gate", "up", "down")


def test_targets_normalize_hf_names_all_and_order():
    assert LoraSpec(rank=4, targets=("v_proj", "q", "down_proj")).targets == ("q", "v", "down")
    assert LoraSpec(rank=4, targets=["all"]).targets == ALL
    assert LoraSpec(rank=4, targets="up, gate").targets == ("gate", "up")
    assert LoraSpec().targets == ALL


def test_unknown_target_is_named():
    with pytest.raises(ValidationError, match="lm_head"):
        LoraSpec(rank=4, targets=("q", "lm_head"))


@pytest.mark.parametrize("bad", [{"rank": 0}, {"dropout": 0.1}, {"targets": ()}, {"lora_r": 4}])
def test_invalid_fields_rejected(bad):
    with pytest.raises(ValidationError):
        LoraSpec(**bad)


def test_dropout_message_says_why():
    with pytest.raises(ValidationError, match="exact"):
        LoraSpec(dropout=0.05)


def test_frozen():
    spec = LoraSpec()
    with pytest.raises(ValidationError):
        spec.rank = 4


@pytest.mark.parametrize("rslora", [False, True])
def test_scaling_matches_peft_formula(rslora):
    spec = LoraSpec(rank=8, alpha=16, use_rslora=rslora)
    config = LoraConfig(r=8, lora_alpha=16, use_rslora=rslora)
    expected = config.lora_alpha / (math.sqrt(config.r) if rslora else config.r)
    assert spec.scaling == expected == (16 / math.sqrt(8) if rslora else 2.0)


def test_module_suffixes_and_paths():
    spec = LoraSpec(rank=2, targets=("q", "down"))
    assert spec.module_suffixes() == ("self_attn.q_proj", "mlp.down_proj")
    assert spec.hf_target_modules() == ["q_proj", "down_proj"]
    names = [
        "model.layers.0.self_attn",
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.k_proj",
        "model.layers.0.mlp.down_proj",
        "model.layers.1.self_attn.q_proj",
        "model.layers.1.self_attn.xq_proj",
        "lm_head",
    ]
    assert spec.target_module_paths(names) == [
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.mlp.down_proj",
        "model.layers.1.self_attn.q_proj",
    ]
