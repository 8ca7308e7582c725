"""The MeBP step gives the gradients of transformers + PEFT autograd, for every family."""

from __future__ import annotations

from pathlib import Path

import peft
import pytest
import torch
import transformers
from engine_fixtures import FAMILIES, LORA, random_batch

from mebp_core.config import EngineKnobs
from mebp_core.engine.checkpoints import make_checkpoints
from mebp_core.engine.mebp import compute_logits, count_valid_targets, run_mebp_step
from mebp_core.engine.model import load_engine_model
from mebp_core.lora.peft_io import save_peft_adapter
from mebp_core.store.reader import open_store


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-12))


def write_random_adapter(hf_dir: Path, out: Path, seed: int) -> Path:
    """A non-zero adapter (B != 0) on every targeted projection, so the LoRA path matters."""
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir)
    gen = torch.Generator().manual_seed(seed)
    adapters = {}
    for path in LORA.target_module_paths(name for name, _ in model.named_modules()):
        linear = model.get_submodule(path)
        a = torch.randn(LORA.rank, linear.in_features, generator=gen) * 0.1
        b = torch.randn(linear.out_features, LORA.rank, generator=gen) * 0.1
        adapters[path] = (a, b)
    save_peft_adapter(out, adapters, LORA, base_model_name_or_path=str(hf_dir))
    return out


def peft_gradients(hf_dir: Path, adapter_dir: Path, input_ids, labels, state_dict=None):
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    if state_dict is not None:
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
        assert not unexpected
    peft_model = peft.PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)
    output = peft_model(input_ids=input_ids, labels=labels)
    output.loss.backward()
    grads = {}
    for name, param in peft_model.named_parameters():
        if "lora_" in name:
            path = name.removeprefix("base_model.model.").split(".lora_")[0]
            kind = "A" if ".lora_A." in name else "B"
            grads[(path, kind)] = param.grad.detach().clone()
    return float(output.loss), grads


def engine_gradients(packed_dir: Path, adapter_dir: Path, input_ids, labels,
                     compute_dtype: str = "float32", **knobs):
    engine_knobs = EngineKnobs(**knobs)
    engine = load_engine_model(packed_dir, compute_dtype=compute_dtype, lora_spec=LORA,
                               init_adapter=adapter_dir, knobs=engine_knobs)
    valid = count_valid_targets(labels)
    checkpoints = make_checkpoints(engine_knobs.checkpoint_storage, adapter_dir.parent)
    result = run_mebp_step(engine, input_ids, labels, checkpoints, loss_scale=1.0 / valid)
    grads = {}
    for path, module in engine.lora.items():
        grads[(path, "A")] = module.lora_A.weight.grad
        grads[(path, "B")] = module.lora_B.weight.grad
    engine.last_checkpoints = checkpoints
    return result.loss_sum / valid, grads, engine


@pytest.mark.parametrize("family", FAMILIES)
def test_gradients_equal_peft_autograd(family, tiny_models, packed_models, tmp_path):
    hf_dir = tiny_models[family]
    adapter = write_random_adapter(hf_dir, tmp_path / "adapter", seed=1)
    config = transformers.AutoConfig.from_pretrained(hf_dir)
    input_ids, labels = random_batch(config.vocab_size, seed=2)

    expected_loss, expected = peft_gradients(hf_dir, adapter, input_ids, labels)
    loss, actual, _ = engine_gradients(packed_models[family, "none"], adapter, input_ids, labels)

    assert loss == pytest.approx(expected_loss, rel=1e-5)
    assert actual.keys() == expected.keys()
    worst = max(relative_error(actual[key], expected[key]) for key in expected)
    assert worst <= 1e-4, f"{family}: worst LoRA gradient relative error {worst:.2e}"


@pytest.mark.parametrize("knobs", [{}, {"graph_tail_blocks": 2}],
                         ids=["default", "graph-tail-2"])  # a tail's blocks step together
@pytest.mark.parametrize("family", FAMILIES)
def test_one_sgd_step_equals_peft(family, knobs, tiny_models, packed_models, tmp_path):
    hf_dir = tiny_models[family]
    adapter = write_random_adapter(hf_dir, tmp_path / "adapter", seed=3)
    config = transformers.AutoConfig.from_pretrained(hf_dir)
    input_ids, labels = random_batch(config.vocab_size, seed=4)
    lr = 0.5
    _, expected_grads = peft_gradients(hf_dir, adapter, input_ids, labels)

    engine = load_engine_model(packed_models[family, "none"], lora_spec=LORA, init_adapter=adapter,
                               knobs=EngineKnobs(**knobs))
    before = {path: (m.lora_A.weight.detach().clone(), m.lora_B.weight.detach().clone())
              for path, m in engine.lora.items()}
    optimizers = [torch.optim.SGD(engine.block_parameters(i), lr=lr)
                  for i in range(len(engine.layers))]

    def update(index: int) -> None:  # fused: each block steps as soon as its grads are done
        optimizers[index].step()
        optimizers[index].zero_grad(set_to_none=True)

    run_mebp_step(engine, input_ids, labels, make_checkpoints("ram"),
                  loss_scale=1.0 / count_valid_targets(labels), on_block_done=update)
    for path, (a, b) in engine.adapter_tensors().items():
        expect_a = before[path][0] - lr * expected_grads[(path, "A")]
        expect_b = before[path][1] - lr * expected_grads[(path, "B")]
        assert relative_error(a, expect_a) <= 1e-4
        assert relative_error(b, expect_b) <= 1e-4
        assert not torch.equal(b, before[path][1])


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_int4_gradients_equal_autograd_on_dequantized_weights(family, tiny_models,
                                                               packed_models, tmp_path):
    hf_dir = tiny_models[family]
    packed = packed_models[family, "int4"]
    store = open_store(packed)
    dequantized = {name: store.dequantize(name, torch.float32) for name in store.names()}
    store.close()
    adapter = write_random_adapter(hf_dir, tmp_path / "adapter", seed=5)
    config = transformers.AutoConfig.from_pretrained(hf_dir)
    input_ids, labels = random_batch(config.vocab_size, seed=6)

    expected_loss, expected = peft_gradients(hf_dir, adapter, input_ids, labels, dequantized)
    loss, actual, _ = engine_gradients(packed, adapter, input_ids, labels)

    assert loss == pytest.approx(expected_loss, rel=1e-5)
    worst = max(relative_error(actual[key], expected[key]) for key in expected)
    assert worst <= 1e-4, f"{family} int4: worst gradient relative error {worst:.2e}"


@pytest.mark.parametrize("every", [1, 2])
def test_mmap_checkpoints_give_the_same_gradients(tiny_models, packed_models, tmp_path, every):
    """A popped checkpoint is a view of its file-backed slot (the backward and, every 2
    blocks, the segment's re-run read it in place), and the gradients are bit for bit."""
    hf_dir = tiny_models["qwen3"]
    adapter = write_random_adapter(hf_dir, tmp_path / "adapter", seed=7)
    input_ids, labels = random_batch(300, seed=8)
    _, in_ram, _ = engine_gradients(packed_models["qwen3", "int4"], adapter, input_ids, labels,
                                    checkpoint_blocks=every)
    _, on_disk, _ = engine_gradients(packed_models["qwen3", "int4"], adapter, input_ids, labels,
                                     checkpoint_storage="mmap", checkpoint_blocks=every)
    for key, grad in in_ram.items():
        assert torch.equal(grad, on_disk[key])


@pytest.mark.parametrize("family", FAMILIES)
def test_peft_loads_our_adapter_and_gets_the_engine_logits(family, tiny_models, packed_models,
                                                           tmp_path):
    hf_dir = tiny_models[family]
    adapter = write_random_adapter(hf_dir, tmp_path / "adapter", seed=9)
    input_ids, _ = random_batch(300, seed=10)
    engine = load_engine_model(packed_models[family, "none"], lora_spec=LORA,
                               init_adapter=adapter)
    ours = compute_logits(engine, input_ids)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    base = model(input_ids=input_ids).logits.detach()
    with torch.no_grad():
        theirs = peft.PeftModel.from_pretrained(model, adapter)(input_ids=input_ids).logits
    assert relative_error(ours, theirs) <= 1e-5
    assert relative_error(base, theirs) > 1e-2  # the adapter matters


def global_relative_error(actual: dict, expected: dict) -> float:
    diff = torch.cat([(actual[k].float() - expected[k]).flatten() for k in expected])
    return float(diff.norm() / torch.cat([v.flatten() for v in expected.values()]).norm())


@pytest.mark.parametrize("mlp_chunk_tokens", [None, 16])
@pytest.mark.parametrize("bf16_matmul", ["native", "float32"])
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_bfloat16_gradients_are_as_accurate_as_peft_in_bfloat16(family, bf16_matmul,
                                                                 mlp_chunk_tokens, tiny_models,
                                                                 packed_models, tmp_path):
    """bf16 has an 8-bit mantissa, so neither side is exact: measured against the float32
    gradient, the engine's bf16 error must be of the order of transformers + PEFT's own,
    whether its matmuls run in bf16 or in float32 on bf16 storage."""
    hf_dir = tiny_models[family]
    adapter = write_random_adapter(hf_dir, tmp_path / "adapter", seed=11)
    input_ids, labels = random_batch(300, seed=12)
    _, exact = peft_gradients(hf_dir, adapter, input_ids, labels)

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16)
    peft_model = peft.PeftModel.from_pretrained(model, adapter, is_trainable=True)
    peft_model(input_ids=input_ids, labels=labels).loss.backward()
    peft_bf16 = {}
    for name, param in peft_model.named_parameters():
        if param.grad is not None:
            path = name.removeprefix("base_model.model.").split(".lora_")[0]
            peft_bf16[(path, "A" if ".lora_A." in name else "B")] = param.grad.float()

    engine = load_engine_model(packed_models[family, "none"], compute_dtype="bfloat16",
                               lora_spec=LORA, init_adapter=adapter,
                               knobs=EngineKnobs(bf16_matmul=bf16_matmul,
                                                 mlp_chunk_tokens=mlp_chunk_tokens))
    run_mebp_step(engine, input_ids, labels, make_checkpoints("ram"),
                  loss_scale=1.0 / count_valid_targets(labels))
    ours = {}
    for path, module in engine.lora.items():
        ours[(path, "A")], ours[(path, "B")] = module.lora_A.weight.grad, module.lora_B.weight.grad

    ours_error = global_relative_error(ours, exact)
    peft_error = global_relative_error(peft_bf16, exact)
    assert 0 < peft_error < 0.2
    assert ours_error <= 2 * peft_error, f"{family}: {ours_error:.2e} vs PEFT {peft_error:.2e}"
