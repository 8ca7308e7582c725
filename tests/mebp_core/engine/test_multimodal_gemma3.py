"""A multimodal Gemma 3 checkpoint: the engine trains its text model, and the adapter loads
onto ``Gemma3ForConditionalGeneration`` with PEFT, leaving the vision tower alone."""

from __future__ import annotations

import peft
import pytest
import torch
import transformers
from engine_fixtures import LORA, random_batch

from mebp_core.engine.checkpoints import make_checkpoints
from mebp_core.engine.mebp import compute_logits, count_valid_targets, run_mebp_step
from mebp_core.engine.model import load_engine_model
from mebp_core.store.pack import pack_model


@pytest.fixture(scope="module")
def multimodal_dir(tmp_path_factory):
    text = transformers.Gemma3TextConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
        query_pre_attn_scalar=16, layer_types=["sliding_attention", "full_attention"])
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=2,
                                             image_size=28, patch_size=14)
    config = transformers.Gemma3Config(text_config=text.to_dict(),
                                       vision_config=vision.to_dict(), mm_tokens_per_image=4,
                                       image_token_index=299, boi_token_index=297,
                                       eoi_token_index=298)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config)
    directory = tmp_path_factory.mktemp("gemma3mm") / "hf"
    model.save_pretrained(directory)
    return directory


def test_adapter_trained_on_the_text_model_loads_on_the_multimodal_model(multimodal_dir,
                                                                           tmp_path):
    packed = pack_model(multimodal_dir, tmp_path / "packed", quant="none")
    engine = load_engine_model(packed, lora_spec=LORA)
    input_ids, labels = random_batch(296, seed=0)
    optimizer_lr = 0.5
    run_mebp_step(engine, input_ids, labels, make_checkpoints("ram"),
                  loss_scale=1.0 / count_valid_targets(labels))
    with torch.no_grad():
        for param in engine.lora_parameters():
            param -= optimizer_lr * param.grad  # B moves off zero: the adapter now matters
    engine.save_adapter(tmp_path / "adapter")
    ours = compute_logits(engine, input_ids)

    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(multimodal_dir)
    peft_model = peft.PeftModel.from_pretrained(model, tmp_path / "adapter")
    adapted = [name for name, module in peft_model.named_modules()
               if isinstance(module, peft.tuners.lora.LoraLayer)]
    assert adapted and all("language_model.layers." in name for name in adapted)
    with torch.no_grad():
        theirs = peft_model(input_ids=input_ids).logits
    error = float((ours - theirs).abs().max() / theirs.abs().max())
    assert error <= 1e-5

    resumed = load_engine_model(packed, lora_spec=LORA, init_adapter=tmp_path / "adapter")
    for path, (a, b) in engine.adapter_tensors().items():
        assert torch.equal(resumed.lora[path].lora_A.weight, a)
        assert torch.equal(resumed.lora[path].lora_B.weight, b)
