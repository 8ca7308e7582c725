"""The single-pass chunked head loss equals cross-entropy on full logits, softcap included,
and holds the memory the planner counts for it."""

from __future__ import annotations

import psutil
import pytest
import torch
import torch.nn.functional as F
import transformers

from mebp_core.bench.worker import peak_rss_mb
from mebp_core.config import EngineKnobs
from mebp_core.engine.frozen import WeightWorkingSet
from mebp_core.engine.loss import IGNORE_INDEX, compute_head_loss
from mebp_core.plan.arch import architecture_from_config
from mebp_core.plan.predict import loss_chunk_bytes
from mebp_core.plan.workload import Workload
from mebp_core.store.pack import pack_model
from mebp_core.store.reader import open_store
from mebp_core.units import MB


@pytest.mark.parametrize("softcap", [None, 3.0, 30.0])
@pytest.mark.parametrize("tile_bytes", [1 << 16, 1 << 24])
def test_loss_and_gradient_equal_autograd_on_full_logits(packed_models, softcap, tile_bytes):
    store = open_store(packed_models["qwen2", "none"])
    head = "model.embed_tokens.weight"
    weight = store.dequantize(head, torch.float32)  # (V, D)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(24, weight.shape[1], generator=gen)
    targets = torch.randint(0, weight.shape[0], (24,), generator=gen)
    targets[[0, 5, 6]] = IGNORE_INDEX

    ours = compute_head_loss(hidden, targets, store=store, head_name=head,
                             dtype=torch.float32, tile_bytes=tile_bytes, softcap=softcap,
                             working_set=WeightWorkingSet())

    reference_hidden = hidden.clone().requires_grad_(True)
    logits = reference_hidden @ weight.T
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    loss = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")
    loss.backward()
    valid = targets != IGNORE_INDEX
    assert ours.valid_tokens == int(valid.sum())
    assert ours.correct_tokens == int((logits.argmax(-1) == targets)[valid].sum())
    assert float(ours.loss_sum) == pytest.approx(float(loss), rel=1e-5)
    torch.testing.assert_close(ours.grad_hidden, reference_hidden.grad, rtol=1e-4, atol=1e-6)


def test_float32_matmuls_on_a_bf16_head_give_the_gradient_of_its_bf16_values(packed_models):
    """The AVX2 hosts' path: every product, and the target rows the gradient subtracts, use
    the bf16 model's weights (rounded as the kernel writes float32 tiles), never the
    unrounded dequantization."""
    store = open_store(packed_models["qwen2", "int4"])
    head = "model.embed_tokens.weight"
    weight = store.dequantize(head, torch.bfloat16).float()  # (V, D), the model's values
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(24, weight.shape[1], generator=gen)
    targets = torch.randint(0, weight.shape[0], (24,), generator=gen)

    ours = compute_head_loss(hidden, targets, store=store, head_name=head,
                             dtype=torch.float32, tile_bytes=1 << 16,
                             working_set=WeightWorkingSet(weight_values=torch.bfloat16))

    reference_hidden = hidden.clone().requires_grad_(True)
    loss = F.cross_entropy(reference_hidden @ weight.T, targets, reduction="sum")
    loss.backward()
    assert float(ours.loss_sum) == pytest.approx(float(loss), rel=1e-6)
    torch.testing.assert_close(ours.grad_hidden, reference_hidden.grad, rtol=1e-5, atol=1e-7)


def reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_losss_peak_is_what_the_planner_counts(tmp_path, dtype):
    """The kernel's peak while the loss runs stays within the planner's loss term (plus the
    head's tile, counted with the weights). Tiles that made their temporaries afresh ran 14
    bytes per token and vocabulary row in bfloat16 against the planner's 10."""
    config = transformers.Qwen2Config(vocab_size=32768, hidden_size=64, intermediate_size=96,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, tie_word_embeddings=True)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "hf")
    store = open_store(pack_model(tmp_path / "hf", tmp_path / "packed", quant="int4"))
    head, tokens, tile_bytes = "model.embed_tokens.weight", 512, 2 << 20
    torch_dtype = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, 64, generator=gen)
    targets = torch.randint(0, 32768, (tokens,), generator=gen)

    def loss():
        return compute_head_loss(hidden, targets, store=store, head_name=head,
                                 dtype=torch_dtype, tile_bytes=tile_bytes,
                                 working_set=WeightWorkingSet())

    loss()  # the store's pages and the kernels' first use
    before = psutil.Process().memory_info().rss
    reset_peak_rss()
    result = loss()
    grew = peak_rss_mb() * MB - before

    arch = architecture_from_config(config.to_dict())
    workload = Workload(arch=arch, seq_len=tokens, compute_dtype=dtype)
    em = torch_dtype.itemsize
    counted = loss_chunk_bytes(workload, EngineKnobs(loss_vocab_tile_bytes=tile_bytes), em)
    rows = tile_bytes // (64 * em)
    assert result.valid_tokens == tokens
    assert counted > 8 * MB  # big enough for a miss to show
    assert grew <= counted + rows * 64 * em + 2 * MB, (grew / MB, counted / MB)
