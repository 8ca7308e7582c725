"""A config's tensor shapes, read with the defaults of store/config_defaults.py (no
transformers, no torch), are the shapes of transformers' full config, and so are the planner's
architecture and the engine's heads: for every preset, and for hub-style configs that omit
the defaulted fields."""

from __future__ import annotations

import sys

import pytest

from mebp_core.models import UnknownArchitectureError, architecture_module, text_config
from mebp_core.plan.arch import PlanInputError, architecture_from_config
from mebp_core.store.preset_configs import PRESET_CONFIGS, preset_config
from mebp_core.store.shapes import expected_shapes, full_text_config, tensor_shapes

SPARSE_CONFIGS = {
    # no kv heads, head size, tie or biases: each architecture's own defaults
    "llama": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
              "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 300},
    "qwen2": {"model_type": "qwen2", "hidden_size": 256, "intermediate_size": 512,
              "num_attention_heads": 64, "num_hidden_layers": 2, "vocab_size": 300},
    "qwen3": {"model_type": "qwen3", "hidden_size": 256, "intermediate_size": 512,
              "num_attention_heads": 64, "num_hidden_layers": 2, "vocab_size": 300},
    "qwen2 kv null": {"model_type": "qwen2", "hidden_size": 256, "intermediate_size": 512,
                      "num_attention_heads": 4, "num_key_value_heads": None,
                      "num_hidden_layers": 1, "vocab_size": 300},
    "gemma3_text": {"model_type": "gemma3_text", "num_hidden_layers": 2, "vocab_size": 300},
    # multimodal Gemma 3: the text config nested, most of it left to the defaults
    "gemma3": {"model_type": "gemma3", "text_config": {"num_hidden_layers": 2}},
    "gemma3 untied": {"model_type": "gemma3", "tie_word_embeddings": False,
                      "text_config": {"num_hidden_layers": 1, "vocab_size": 300}},
    "llama with biases": {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
                          "num_attention_heads": 2, "num_key_value_heads": 1,
                          "num_hidden_layers": 1, "vocab_size": 300, "attention_bias": True,
                          "mlp_bias": True, "tie_word_embeddings": True},
}
CONFIGS = [*(preset_config(name) for name in sorted(PRESET_CONFIGS)), *SPARSE_CONFIGS.values()]
IDS = [*sorted(PRESET_CONFIGS), *SPARSE_CONFIGS]


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_the_shapes_and_the_planners_architecture_are_transformers(config):
    full = full_text_config(config)
    assert expected_shapes(config) == tensor_shapes(full)
    arch = architecture_from_config(config)
    assert (arch.hidden_size, arch.intermediate_size, arch.num_layers, arch.num_heads,
            arch.num_kv_heads, arch.head_dim, arch.vocab_size, arch.tied_embeddings) == (
        full["hidden_size"], full["intermediate_size"], full["num_hidden_layers"],
        full["num_attention_heads"], full.get("num_key_value_heads") or full["num_attention_heads"],
        full.get("head_dim") or full["hidden_size"] // full["num_attention_heads"],
        full["vocab_size"], full["tie_word_embeddings"])


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "qwen2 kv null",
                                  "llama with biases"])
def test_the_engine_takes_transformers_heads_and_head_size(name):
    config = SPARSE_CONFIGS[name]
    full = full_text_config(config)
    args = architecture_module(config).ModelArgs.from_hf_config(text_config(config))
    assert (args.num_key_value_heads, args.head_dim) == (
        full.get("num_key_value_heads") or full["num_attention_heads"],
        full.get("head_dim") or full["hidden_size"] // full["num_attention_heads"])


def test_an_unknown_model_type_is_named():
    with pytest.raises(UnknownArchitectureError, match="'mistral' is not supported"):
        expected_shapes({"model_type": "mistral"})
    with pytest.raises(PlanInputError, match="'mistral' is not supported"):
        architecture_from_config({"model_type": "mistral"})


def test_shapes_are_read_without_torch():
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", "import sys; from mebp_core.store.shapes import expected_shapes;"
         " from mebp_core.store.preset_configs import preset_config;"
         " expected_shapes(preset_config('gemma3-1b')); print('torch' in sys.modules)"],
        capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "False"
