"""Every memory/time knob keeps the gradients those of transformers + PEFT autograd, and does
what it says (what is resident, how many checkpoints, what the LoRA branch saves)."""

from __future__ import annotations

import pytest
import torch
import transformers
from engine_fixtures import random_batch
from test_exactness import engine_gradients, peft_gradients, relative_error, write_random_adapter

from mebp_core.lora.function import lora_delta

KNOB_SETTINGS = {
    "defaults": {},
    "resident": dict(frozen_weights="resident"),
    "resident-budget": dict(frozen_weights="resident", resident_weight_bytes=40_000),
    "every-2-blocks": dict(checkpoint_blocks=2),
    "every-3-blocks-mmap": dict(checkpoint_blocks=3, checkpoint_storage="mmap"),
    "no-checkpoints": dict(checkpoint_blocks="none"),
    "lora-hidden-stored": dict(lora_hidden="store"),
    "no-checkpoints-resident-stored": dict(checkpoint_blocks="none", frozen_weights="resident",
                                           lora_hidden="store"),
    "unshared-small-tiles": dict(share_decompression=False, decompress_tile_bytes=1 << 16,
                                 loss_vocab_tile_bytes=1 << 16, checkpoint_blocks=2),
    # 40 tokens a batch: chunks of 7 leave a short last one
    "mlp-chunks": dict(mlp_chunk_tokens=7),
    "mlp-chunks-unshared": dict(mlp_chunk_tokens=16, share_decompression=False,
                                decompress_tile_bytes=1 << 16, loss_vocab_tile_bytes=1 << 16,
                                checkpoint_blocks=2),
    "mlp-chunks-resident": dict(mlp_chunk_tokens=16, frozen_weights="resident",
                                resident_weight_bytes=40_000),
    # the last blocks in one graph, the ones before checkpointed (3 blocks; gemma3 has 4)
    "graph-tail-1": dict(graph_tail_blocks=1),
    "graph-tail-2-every-2-mmap": dict(graph_tail_blocks=2, checkpoint_blocks=2,
                                      checkpoint_storage="mmap"),
    "graph-tail-2-unshared-resident": dict(graph_tail_blocks=2, share_decompression=False,
                                           decompress_tile_bytes=1 << 16,
                                           frozen_weights="resident",
                                           resident_weight_bytes=40_000),
    "graph-tail-past-the-model": dict(graph_tail_blocks=9),
    # the store read with O_DIRECT a block ahead (its weights unquantized here)
    "direct-reads": dict(store_reads="direct"),
    "direct-reads-every-2-small-tiles": dict(store_reads="direct", checkpoint_blocks=2,
                                             share_decompression=False,
                                             decompress_tile_bytes=1 << 16,
                                             loss_vocab_tile_bytes=1 << 16),
}


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
@pytest.mark.parametrize("setting", list(KNOB_SETTINGS))
def test_knob_gradients_equal_peft_autograd(setting, family, tiny_models, packed_models,
                                            tmp_path):
    hf_dir = tiny_models[family]
    adapter = write_random_adapter(hf_dir, tmp_path / "adapter", seed=21)
    config = transformers.AutoConfig.from_pretrained(hf_dir)
    input_ids, labels = random_batch(config.vocab_size, seed=22)

    expected_loss, expected = peft_gradients(hf_dir, adapter, input_ids, labels)
    loss, actual, _ = engine_gradients(packed_models[family, "none"], adapter, input_ids, labels,
                                       **KNOB_SETTINGS[setting])

    assert loss == pytest.approx(expected_loss, rel=1e-5)
    assert actual.keys() == expected.keys()
    worst = max(relative_error(actual[key], expected[key]) for key in expected)
    assert worst <= 1e-4, f"{setting}, {family}: worst relative error {worst:.2e}"


def run_with(setting, tiny_models, packed_models, tmp_path, family="llama"):
    adapter = write_random_adapter(tiny_models[family], tmp_path / "adapter", seed=23)
    input_ids, labels = random_batch(300, seed=24)
    return engine_gradients(packed_models[family, "int4"], adapter, input_ids, labels,
                            **KNOB_SETTINGS[setting])[2]


def test_resident_weights_are_all_projections_and_the_head(tiny_models, packed_models,
                                                           tmp_path):
    engine = run_with("resident", tiny_models, packed_models, tmp_path)
    n_layers = len(engine.layers)
    assert len(engine.working_set.resident) == 7 * n_layers + 1  # + lm_head (llama is untied)
    assert "lm_head.weight" in engine.working_set.resident
    assert engine.working_set.decompressed_params == 0  # the step decompressed nothing


def test_resident_budget_keeps_the_first_blocks_within_the_budget(tiny_models, packed_models,
                                                                  tmp_path):
    engine = run_with("resident-budget", tiny_models, packed_models, tmp_path)
    resident = engine.working_set.resident
    assert 0 < engine.working_set.resident_bytes <= 40_000
    assert all(name.startswith("model.layers.0.") for name in resident)
    assert engine.working_set.decompressed_params > 0  # the rest stayed lazy


@pytest.mark.parametrize(("setting", "slots"), [("every-2-blocks", 2), ("no-checkpoints", 0)])
def test_checkpoint_policy_sets_how_many_block_inputs_are_kept(setting, slots, tiny_models,
                                                               packed_models, tmp_path):
    engine = run_with(setting, tiny_models, packed_models, tmp_path)
    checkpoints = engine.last_checkpoints
    one_input = 2 * 20 * 64 * 4  # (B, T, D) float32
    assert checkpoints.peak_nbytes == slots * one_input  # 3 blocks: inputs of 0 and 2, or none


def test_stored_lora_hidden_is_saved_for_backward_and_gives_the_same_gradients():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 16, generator=gen, requires_grad=True)
    a = torch.randn(4, 16, generator=gen, requires_grad=True)
    b = torch.randn(8, 4, generator=gen, requires_grad=True)
    grads = {}
    for store in (False, True):
        y = lora_delta(x, a, b, 2.0, store_hidden=store)
        saved = [t for t in y.grad_fn.saved_tensors if t is not None]
        assert len(saved) == (4 if store else 3)
        grads[store] = torch.autograd.grad(y.square().sum(), (x, a, b))
    for recomputed, stored in zip(grads[False], grads[True], strict=True):
        torch.testing.assert_close(stored, recomputed, rtol=1e-6, atol=1e-6)


def test_mlp_chunks_reuse_each_shared_weight_once_per_block(tiny_models, packed_models,
                                                            tmp_path):
    whole = run_with("defaults", tiny_models, packed_models, tmp_path)
    chunked = run_with("mlp-chunks", tiny_models, packed_models, tmp_path)
    config = transformers.AutoConfig.from_pretrained(tiny_models["llama"])
    mlp = 3 * config.hidden_size * config.intermediate_size  # one block's
    # shared: one decompression per projection per block in backward, however many chunks;
    # only the forward's tiles are decompressed again, for 40 tokens in 6 chunks of 7
    extra = chunked.working_set.decompressed_params - whole.working_set.decompressed_params
    assert extra == 5 * mlp * config.num_hidden_layers
    assert chunked.working_set.live_bytes == 0 and chunked.working_set.shared is None


def test_unshared_mlp_chunks_decompress_the_mlp_once_more_per_chunk(tiny_models,
                                                                    packed_models, tmp_path):
    one = run_with("unshared-small-tiles", tiny_models, packed_models, tmp_path)
    chunked = run_with("mlp-chunks-unshared", tiny_models, packed_models, tmp_path)
    config = transformers.AutoConfig.from_pretrained(tiny_models["llama"])
    mlp = 3 * config.hidden_size * config.intermediate_size  # one block's
    layers = config.num_hidden_layers
    reruns = layers // 2  # checkpoints every 2 blocks: each pair's first block is re-run
    down = config.hidden_size * config.intermediate_size
    # every pass of a block's MLP (forward, re-run, recompute, backward) in 3 chunks of 40
    # tokens decompresses its tiles three times instead of once, but for the recompute's
    # down projection, which is never multiplied (test_recompute_skip)
    extra = chunked.working_set.decompressed_params - one.working_set.decompressed_params
    assert extra == 2 * mlp * (3 * layers + reruns) - 2 * down * layers


def test_mlp_chunks_need_checkpoints():
    from mebp_core.config import EngineKnobs

    with pytest.raises(ValueError, match="mlp_chunk_tokens"):
        EngineKnobs(checkpoint_blocks="none", mlp_chunk_tokens=8)


@pytest.mark.parametrize("setting", [s for s in KNOB_SETTINGS if s.startswith("graph-tail")])
# bf16 storage with float32 matmuls is the AVX2 hosts' path: tested wherever the suite runs
@pytest.mark.parametrize(("dtype", "matmul"), [("float32", "auto"), ("bfloat16", "native"),
                                               ("bfloat16", "float32")])
def test_a_graph_tail_gives_the_default_steps_gradients_bit_for_bit(setting, dtype, matmul,
                                                                    tiny_models,
                                                                    packed_models, tmp_path):
    """The tail's blocks run the same ops once under autograd instead of twice (a forward,
    then a recompute), and their backward is the same graph chained: the same bits."""
    adapter = write_random_adapter(tiny_models["llama"], tmp_path / "adapter", seed=25)
    input_ids, labels = random_batch(300, seed=26)
    packed = packed_models["llama", "int4"]
    loss, expected, _ = engine_gradients(packed, adapter, input_ids, labels,
                                         compute_dtype=dtype, bf16_matmul=matmul)
    tail_loss, actual, engine = engine_gradients(packed, adapter, input_ids, labels,
                                                 compute_dtype=dtype, bf16_matmul=matmul,
                                                 **KNOB_SETTINGS[setting])
    assert tail_loss == loss
    for key, grad in expected.items():
        assert torch.equal(actual[key], grad), key
    assert engine.working_set.live_bytes == engine.working_set.resident_bytes


@pytest.mark.parametrize(("tail", "slots"), [(0, 3), (1, 2), (2, 1), (3, 0), (5, 0)])
def test_a_graph_tail_of_k_blocks_checkpoints_the_others(tail, slots, tiny_models,
                                                         packed_models, tmp_path):
    adapter = write_random_adapter(tiny_models["llama"], tmp_path / "adapter", seed=23)
    input_ids, labels = random_batch(300, seed=24)
    engine = engine_gradients(packed_models["llama", "int4"], adapter, input_ids, labels,
                              graph_tail_blocks=tail)[2]
    one_input = 2 * 20 * 64 * 4  # (B, T, D) float32
    assert engine.last_checkpoints.peak_nbytes == slots * one_input


def test_a_graph_tail_needs_checkpoints_and_whole_blocks():
    from mebp_core.config import EngineKnobs

    with pytest.raises(ValueError, match="graph_tail_blocks"):
        EngineKnobs(checkpoint_blocks="none", graph_tail_blocks=2)
    with pytest.raises(ValueError, match="graph_tail_blocks"):
        EngineKnobs(mlp_chunk_tokens=64, graph_tail_blocks=2)
    assert EngineKnobs(checkpoint_blocks="none", graph_tail_blocks=0).graph_tail_blocks == 0
