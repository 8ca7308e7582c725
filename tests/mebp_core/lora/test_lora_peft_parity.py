"""Our LoRA against PEFT itself on tiny Llama and Qwen2 models, through the saved files."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

from mebp_core.lora.linear import apply_lora, assign_lora_tensors, collect_lora_tensors
from mebp_core.lora.peft_io import load_peft_adapter, save_peft_adapter
from mebp_core.lora.spec import LoraSpec

SPEC = LoraSpec(rank=4, alpha=8, targets="all")


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def peft_lora_weights(peft_model, path: str) -> tuple[torch.Tensor, torch.Tensor]:
    module = peft_model.base_model.model.get_submodule(path)
    return module.lora_A["default"].weight, module.lora_B["default"].weight


def build_our_model(model_dir, load_tiny_model, set_nonzero_b, spec=SPEC):
    model = load_tiny_model(model_dir)
    adapted = apply_lora(model, spec, seed=11)
    set_nonzero_b(adapted)
    return model, adapted


def test_peft_loads_our_adapter(
    tiny_model_dir, load_tiny_model, set_nonzero_b, token_batch, tmp_path
):
    model, adapted = build_our_model(tiny_model_dir, load_tiny_model, set_nonzero_b)
    out = save_peft_adapter(tmp_path / "ad", collect_lora_tensors(adapted), SPEC, None)
    base = load_tiny_model(tiny_model_dir)
    with torch.no_grad():
        base_logits = base(input_ids=token_batch["input_ids"]).logits
    peft_model = PeftModel.from_pretrained(base, out).eval()

    assert len(adapted) == 2 * 7
    for path, module in adapted.items():
        peft_a, peft_b = peft_lora_weights(peft_model, path)
        assert torch.equal(peft_a, module.lora_A.weight) and torch.equal(
            peft_b, module.lora_B.weight
        )
    with torch.no_grad():
        ours = model(input_ids=token_batch["input_ids"]).logits
        theirs = peft_model(input_ids=token_batch["input_ids"]).logits
    assert rel_err(ours, theirs) <= 1e-5
    assert rel_err(theirs, base_logits) > 1e-3  # the adapter changes the output


@pytest.mark.parametrize("use_rslora", [False, True])
def test_we_load_peft_adapter(
    tiny_model_dir, load_tiny_model, set_nonzero_b, token_batch, tmp_path, use_rslora
):
    config = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj", "up_proj"],
        use_rslora=use_rslora,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(load_tiny_model(tiny_model_dir), config).eval()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    peft_model.save_pretrained(tmp_path / "peft")

    spec, adapters = load_peft_adapter(tmp_path / "peft")
    assert spec == LoraSpec(rank=4, alpha=8, targets=("q", "v", "up"), use_rslora=use_rslora)
    assert len(adapters) == 2 * 3
    for path, (lora_a, lora_b) in adapters.items():
        peft_a, peft_b = peft_lora_weights(peft_model, path)
        assert torch.equal(lora_a, peft_a) and torch.equal(lora_b, peft_b)

    model = load_tiny_model(tiny_model_dir)
    assign_lora_tensors(apply_lora(model, spec, seed=0), adapters)
    with torch.no_grad():
        ours = model(input_ids=token_batch["input_ids"]).logits
        theirs = peft_model(input_ids=token_batch["input_ids"]).logits
    assert rel_err(ours, theirs) <= 1e-5


def test_sgd_step_matches_peft(
    tiny_model_dir, load_tiny_model, set_nonzero_b, token_batch, tmp_path
):
    model, adapted = build_our_model(tiny_model_dir, load_tiny_model, set_nonzero_b)
    out = save_peft_adapter(tmp_path / "ad", collect_lora_tensors(adapted), SPEC, None)
    peft_model = PeftModel.from_pretrained(load_tiny_model(tiny_model_dir), out, is_trainable=True)
    peft_model.eval()  # no dropout anywhere; eval only fixes the mode, grads still flow

    ours_params = [p for m in adapted.values() for p in (m.lora_A.weight, m.lora_B.weight)]
    theirs_params = [p for path in adapted for p in peft_lora_weights(peft_model, path)]
    assert sum(p.numel() for p in peft_model.parameters() if p.requires_grad) == sum(
        p.numel() for p in ours_params
    )
    ours_opt = torch.optim.SGD(ours_params, lr=0.5)
    theirs_opt = torch.optim.SGD(theirs_params, lr=0.5)
    ours_loss = model(**token_batch).loss
    theirs_loss = peft_model(**token_batch).loss
    ours_loss.backward()
    theirs_loss.backward()
    assert rel_err(ours_loss.detach(), theirs_loss.detach()) <= 1e-6
    for ours, theirs in zip(ours_params, theirs_params, strict=True):
        assert theirs.grad.abs().max() > 0
        assert rel_err(ours.grad, theirs.grad) <= 1e-5
    ours_opt.step()
    theirs_opt.step()
    for ours, theirs in zip(ours_params, theirs_params, strict=True):
        assert rel_err(ours.detach(), theirs.detach()) <= 1e-5
    with torch.no_grad():
        assert rel_err(model(**token_batch).loss, peft_model(**token_batch).loss) <= 1e-5
