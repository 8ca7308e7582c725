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
    # Llama's flags on architectures whose MLP has no biases (transformers ignores them)
    "qwen2 mlp_bias": {"model_type": "qwen2", "hidden_size": 128, "intermediate_size": 256,
                       "num_attention_heads": 2, "num_hidden_layers": 1, "vocab_size": 300,
                       "mlp_bias": True},
    "qwen3 mlp_bias": {"model_type": "qwen3", "hidden_size": 128, "intermediate_size": 256,
                       "num_attention_heads": 2, "head_dim": 64, "num_hidden_layers": 1,
                       "vocab_size": 300, "mlp_bias": True, "attention_bias": True},
}
TEXT_MODELS = [name for name, config in SPARSE_CONFIGS.items()
               if config["model_type"] != "gemma3"]
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


@pytest.mark.parametrize("name", TEXT_MODELS)
def test_the_shapes_are_those_of_the_transformers_models_parameters(name):
    """Against the model transformers builds, not only its config: a flag its architecture
    ignores (Qwen's ``mlp_bias``) makes no tensor."""
    import torch
    import transformers

    config = SPARSE_CONFIGS[name]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**config))
    # a tied head is the embedding: named once
    assert expected_shapes(config) == {
        parameter: tuple(tensor.shape) for parameter, tensor in model.named_parameters()}


@pytest.mark.parametrize("outer", [{}, {"tie_word_embeddings": False},
                                   {"tie_word_embeddings": True},
                                   {"tie_word_embeddings": None}],
                         ids=["", "untied", "tied", "null"])
@pytest.mark.parametrize("inner", [{}, {"tie_word_embeddings": False}],
                         ids=["text", "text untied"])
def test_a_multimodal_gemma3_head_is_tied_as_transformers_ties_it(outer, inner):
    """The outer config's flag decides (transformers' tying reads it, true by default), for
    the shapes, the planner and the engine alike."""
    import torch
    import transformers

    config = {"model_type": "gemma3", **outer,
              "text_config": {"num_hidden_layers": 1, "vocab_size": 300, **inner}}
    with torch.device("meta"):
        model = transformers.Gemma3ForConditionalGeneration(
            transformers.AutoConfig.for_model(**config))
    tied = "lm_head.weight" not in dict(model.named_parameters())
    assert ("lm_head.weight" not in expected_shapes(config)) == tied
    assert architecture_from_config(config).tied_embeddings == tied
    args = architecture_module(config).ModelArgs.from_hf_config(text_config(config))
    assert args.tie_word_embeddings == tied


NULL_BASES = {model_type: {"model_type": model_type, "hidden_size": 128,
                           "intermediate_size": 256, "num_attention_heads": 4,
                           "num_hidden_layers": 1, "vocab_size": 300}
              for model_type in ("llama", "qwen2", "qwen3", "gemma3_text")}
READ_FIELDS = ("num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias",
               "mlp_bias", "hidden_size")


@pytest.mark.parametrize("field", READ_FIELDS)
@pytest.mark.parametrize("model_type", sorted(NULL_BASES))
def test_a_null_is_refused_where_transformers_refuses_it(model_type, field):
    """A null transformers takes (the heads' and head size's fallbacks) gives its shapes; one
    it refuses is refused here too, naming the field, not taken for the default and left
    for packing to fail on."""
    import torch
    import transformers

    from mebp_core.store.config_defaults import ConfigFieldError

    config = {**NULL_BASES[model_type], field: None}
    try:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(
                transformers.AutoConfig.for_model(**config))
    except Exception:  # noqa: BLE001  (a validation error, or a TypeError building the model)
        with pytest.raises(ConfigFieldError, match=field):
            expected_shapes(config)
        with pytest.raises(PlanInputError, match=field):
            architecture_from_config(config)
        return
    assert expected_shapes(config) == {
        parameter: tuple(tensor.shape) for parameter, tensor in model.named_parameters()}
