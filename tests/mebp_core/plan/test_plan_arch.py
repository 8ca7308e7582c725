"""The planner's torch-free reading of configs agrees with the engine's own models."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from mebp_core.models import build_model
from mebp_core.plan.arch import PlanInputError, architecture_from_config, load_architecture
from mebp_core.store.preset_configs import PRESET_CONFIGS
from mebp_core.store.shapes import expected_shapes


@pytest.mark.parametrize("preset", sorted(PRESET_CONFIGS))
def test_architecture_matches_the_engine_model_and_checkpoint_shapes(preset):
    config = PRESET_CONFIGS[preset]
    arch = architecture_from_config(config)
    args = build_meta_model(config).args
    assert (arch.hidden_size, arch.intermediate_size, arch.num_layers, arch.num_heads,
            arch.num_kv_heads, arch.head_dim, arch.vocab_size, arch.tied_embeddings,
            arch.logit_softcap) == (
        args.hidden_size, args.intermediate_size, args.num_hidden_layers,
        args.num_attention_heads, args.num_key_value_heads, args.head_dim, args.vocab_size,
        args.tie_word_embeddings, getattr(args, "final_logit_softcapping", None))
    block = build_meta_model(config).model.layers[0]
    skipped = block.residual_output_projection()
    assert arch.residual_output_projection == (
        None if skipped is None else next(name.rsplit(".", 1)[-1]
                                          for name, module in block.named_modules()
                                          if module is skipped))
    shapes = expected_shapes(config)
    for name, params in arch.frozen_weights():
        assert math.prod(shapes[name]) == params, name
    matrices = sum(math.prod(s) for n, s in shapes.items() if len(s) == 2)
    assert arch.parameter_count() == matrices


def build_meta_model(config):
    import torch

    with torch.device("meta"):
        return build_model(config)


def test_multimodal_gemma3_reads_its_text_config():
    config = {"model_type": "gemma3", "text_config": {"hidden_size": 640,
              "intermediate_size": 2048, "num_hidden_layers": 6, "num_attention_heads": 4,
              "num_key_value_heads": 1, "vocab_size": 1000}}
    arch = architecture_from_config(config)
    assert (arch.model_type, arch.hidden_size, arch.head_dim, arch.tied_embeddings,
            arch.max_positions) == ("gemma3_text", 640, 256, True, 131072)


def test_a_softcapped_gemma3_is_read_as_the_engine_reads_it():
    config = {**PRESET_CONFIGS["gemma3-1b"], "final_logit_softcapping": 30.0}
    assert architecture_from_config(config).logit_softcap == \
        build_meta_model(config).args.final_logit_softcapping == 30.0


def test_bad_configs_name_the_problem(tmp_path):
    with pytest.raises(PlanInputError, match="model_type 'gpt2'"):
        architecture_from_config({"model_type": "gpt2"})
    with pytest.raises(PlanInputError, match="missing field 'hidden_size'"):
        architecture_from_config({"model_type": "llama"})
    with pytest.raises(PlanInputError, match="vocab_size must be a whole number, got 'many'"):
        architecture_from_config({**PRESET_CONFIGS["tiny"], "vocab_size": "many"})
    with pytest.raises(PlanInputError, match="num_attention_heads must be a whole number, got 0"):
        architecture_from_config({**PRESET_CONFIGS["tiny"], "num_attention_heads": 0})
    with pytest.raises(PlanInputError, match="head_dim must be a whole number, got 'wide'"):
        architecture_from_config({**PRESET_CONFIGS["tiny"], "head_dim": "wide"})
    with pytest.raises(PlanInputError, match="an object of fields, not list"):
        architecture_from_config([1, 2])
    with pytest.raises(PlanInputError, match="unknown preset 'nope'"):
        load_architecture("preset:nope")
    with pytest.raises(PlanInputError, match="no config.json"):
        load_architecture(tmp_path)
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(PlanInputError, match="config.json: not valid JSON"):
        load_architecture(tmp_path)


def test_a_model_directory_is_read_from_its_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(PRESET_CONFIGS["qwen2.5-0.5b"]))
    assert load_architecture(tmp_path) == load_architecture("preset:qwen2.5-0.5b")


def test_the_planner_never_imports_torch():
    code = ("import sys\n"
            "from mebp_core.plan.command import build_plan\n"
            "from mebp_core.plan.devices import load_devices\n"
            "load_devices()\n"
            "print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["False", "False"]
