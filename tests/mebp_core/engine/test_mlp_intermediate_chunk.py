"""The MLP run a chunk of intermediate columns at a time (``mlp_intermediate_chunk``) gives the
untiled engine's loss and gradients (to summation order), decompresses each MLP weight once
per pass, and makes no (tokens, intermediate) tensor wider than a chunk."""

from __future__ import annotations

import pytest
import torch
import transformers
from engine_fixtures import random_batch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from mebp_core.config import EngineKnobs
from mebp_core.engine.checkpoints import make_checkpoints
from mebp_core.engine.mebp import count_valid_targets, run_mebp_step
from mebp_core.engine.model import load_engine_model
from mebp_core.lora.spec import LoraSpec
from mebp_core.store.pack import pack_model

INTERMEDIATE = 192  # chunk 64 divides it, 128 leaves a last chunk of 64
FAMILIES = ["llama", "qwen3", "gemma3_text"]
ALL = LoraSpec(rank=4, alpha=8.0, targets="all")
NO_MLP = LoraSpec(rank=4, alpha=8.0, targets=["q_proj", "v_proj", "o_proj"])


def _config(family: str, intermediate_size: int):
    common = dict(vocab_size=300, hidden_size=64, intermediate_size=intermediate_size,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=256, rms_norm_eps=1e-6, mlp_bias=False)
    if family == "llama":
        return transformers.LlamaConfig(**common, tie_word_embeddings=False)
    common.pop("mlp_bias")
    if family == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=24, tie_word_embeddings=True)
    return transformers.Gemma3TextConfig(
        **common, head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=True)


@pytest.fixture(scope="module")
def wide_models(tmp_path_factory):
    """(family, quant[, intermediate size]) -> a packed tiny model whose intermediate size
    takes several chunks (INTERMEDIATE unless given)."""
    root = tmp_path_factory.mktemp("wide")

    class Packed(dict):
        def __missing__(self, key):
            family, quant, width = (*key, INTERMEDIATE)[:3]
            hf_dir = root / f"hf-{family}-{width}"
            if not hf_dir.exists():
                torch.manual_seed(0)
                model = transformers.AutoModelForCausalLM.from_config(_config(family, width))
                with torch.no_grad():
                    for name, param in model.named_parameters():
                        if "norm" in name:
                            param.add_(torch.randn_like(param) * 0.1)
                model.save_pretrained(hf_dir)
            self[key] = pack_model(hf_dir, root / f"{family}-{quant}-{width}", quant=quant,
                                   group_size=32)
            return self[key]

    return Packed()


def step(packed_dir, *, spec=ALL, compute_dtype="float32", seq_len=20, **knobs):
    """Loss, LoRA gradients and engine of one MeBP step from a seeded non-zero adapter."""
    engine = load_engine_model(packed_dir, lora_spec=spec, seed=1, compute_dtype=compute_dtype,
                               knobs=EngineKnobs(**knobs))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in engine.lora.values():
            weight = module.lora_B.weight
            weight.copy_(torch.randn(weight.shape, generator=gen) * 0.1)
    input_ids, labels = random_batch(300, seed=2, seq_len=seq_len)
    valid = count_valid_targets(labels)
    result = run_mebp_step(engine, input_ids, labels, make_checkpoints("ram"),
                           loss_scale=1.0 / valid)
    grads = {(path, kind): getattr(module, f"lora_{kind}").weight.grad
             for path, module in engine.lora.items() for kind in "AB"}
    return result.loss_sum / valid, grads, engine


class _RowWidths(TorchDispatchMode):
    """The last dimensions of the tensors ops make with ``tokens`` rows."""

    def __init__(self, tokens: int = 40) -> None:
        super().__init__()
        self.tokens, self.widths = tokens, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.dim() >= 2 and \
                    tensor.numel() // tensor.shape[-1] == self.tokens:
                self.widths.add(tensor.shape[-1])
        return out


def tiled_step(packed_dir, chunk: int, **kwargs):
    """``step`` with ``mlp_intermediate_chunk`` set, checking that no activation or gradient
    of its 40 tokens is as wide as the intermediate dimension (the untiled step makes them)."""
    with _RowWidths() as probe:
        result = step(packed_dir, mlp_intermediate_chunk=chunk, **kwargs)
    assert INTERMEDIATE not in probe.widths and chunk in probe.widths, probe.widths
    return result


def relative_error(actual: dict, expected: dict) -> float:
    """The worst LoRA gradient's max-abs error relative to its largest entry."""
    return max(float((actual[k] - expected[k]).abs().max()
                     / expected[k].abs().max().clamp_min(1e-12)) for k in expected)


def global_relative_error(actual: dict, expected: dict) -> float:
    diff = torch.cat([(actual[k].float() - expected[k]).flatten() for k in expected])
    return float(diff.norm() / torch.cat([v.flatten() for v in expected.values()]).norm())


# (compute dtype, knobs): float32; bf16 matmuls; bf16 storage with float32 matmuls (the AVX2
# hosts' path), its decompression shared or not
DTYPES = {
    "float32": ("float32", {}),
    "bf16-native": ("bfloat16", dict(bf16_matmul="native")),
    "bf16-upcast": ("bfloat16", dict(bf16_matmul="float32")),
    "bf16-upcast-shared": ("bfloat16", dict(bf16_matmul="float32", share_decompression=True)),
}
FROZEN = {
    "lazy": {},
    "lazy-unshared": dict(share_decompression=False),
    "resident": dict(frozen_weights="resident"),
    "resident-part": dict(frozen_weights="resident", resident_weight_bytes=60_000),
}



def _parity_cases():
    """Every family with each dtype path and lazy/resident weights, both chunk widths; the
    rarer settings (unshared, partly resident, LoRA without the MLP) on fewer."""
    for family in FAMILIES:
        for dtype in DTYPES:
            for frozen in ("lazy", "resident"):
                for chunk in (64, 128):
                    yield family, dtype, frozen, chunk, "lora-all"
        for dtype, frozen, spec in (("float32", "lazy-unshared", "lora-all"),
                                    ("bf16-native", "resident-part", "lora-all"),
                                    ("float32", "lazy", "lora-attention"),
                                    ("bf16-upcast", "resident", "lora-attention")):
            yield family, dtype, frozen, 128, spec


SPECS = {"lora-all": ALL, "lora-attention": NO_MLP}


@pytest.mark.parametrize(("family", "dtype", "frozen", "chunk", "spec"), list(_parity_cases()))
def test_gradients_and_loss_equal_the_untiled_engine(family, dtype, frozen, chunk, spec,
                                                     wide_models):
    compute_dtype, dtype_knobs = DTYPES[dtype]
    knobs = {**dtype_knobs, **FROZEN[frozen]}
    packed, spec = wide_models[family, "int4"], SPECS[spec]
    loss, untiled, _ = step(packed, spec=spec, compute_dtype=compute_dtype, **knobs)
    tiled_loss, tiled, engine = tiled_step(packed, chunk, spec=spec,
                                           compute_dtype=compute_dtype, **knobs)
    assert tiled.keys() == untiled.keys()
    if compute_dtype == "float32":
        assert tiled_loss == pytest.approx(loss, rel=1e-5)
        assert relative_error(tiled, untiled) <= 1e-4
    else:  # bf16 is exact to neither: tiled is about as close to float32 as untiled (the
        # mlp_chunk_tokens bf16 test allows 2x PEFT's own error)
        _, exact, _ = step(packed, spec=spec, **FROZEN[frozen])
        assert tiled_loss == pytest.approx(loss, rel=1e-2)
        untiled_error = global_relative_error(untiled, exact)
        assert 0 < untiled_error < 0.1
        assert global_relative_error(tiled, exact) <= 1.5 * untiled_error  # measured <= 1.21
    ws = engine.working_set
    assert ws.shared is None and ws.live_bytes == ws.resident_bytes


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_gradients_equal_peft_autograd(family, tiny_models, packed_models, tmp_path):
    """The shared tiny models (intermediate 96: chunks of 64 and 32) against transformers +
    PEFT, as test_exactness checks the untiled engine."""
    from test_exactness import engine_gradients, peft_gradients, write_random_adapter

    hf_dir = tiny_models[family]
    adapter = write_random_adapter(hf_dir, tmp_path / "adapter", seed=1)
    input_ids, labels = random_batch(300, seed=2)
    expected_loss, expected = peft_gradients(hf_dir, adapter, input_ids, labels)
    with _RowWidths() as probe:
        loss, actual, _ = engine_gradients(packed_models[family, "none"], adapter, input_ids,
                                           labels, mlp_intermediate_chunk=64)
    assert 96 not in probe.widths and {64, 32} <= probe.widths  # intermediate 96: 64 + 32
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    assert actual.keys() == expected.keys()
    assert relative_error(actual, expected) <= 1e-4


@pytest.mark.parametrize("share", [True, False], ids=["shared", "unshared"])
@pytest.mark.parametrize("family", FAMILIES)
def test_each_mlp_weight_is_decompressed_once_per_pass(family, share, wide_models):
    packed = wide_models[family, "int4"]
    knobs = dict(share_decompression=share)
    untiled = step(packed, **knobs)[2].working_set
    tiled = tiled_step(packed, 64, **knobs)[2].working_set
    # as many passes (3) over the 40 tokens a chunk of tokens at a time
    by_tokens = step(packed, mlp_chunk_tokens=14, **knobs)[2].working_set
    extra = 0
    if family == "gemma3_text":
        # its MLP output is normed before the sum, so the backward needs y before the
        # chunks: a no-grad pass the untiled recompute makes in its autograd forward
        # (which, shared, also serves the backward: gate, up and down once more per
        # block; unshared, gate and up)
        extra = 2 * 64 * INTERMEDIATE * (3 if share else 2)  # 2 blocks
    assert tiled.decompressed_params == untiled.decompressed_params + extra
    assert by_tokens.decompressed_params > tiled.decompressed_params
    # a chunk's slices live, not a block's weights (unshared: the head's tile is the peak)
    assert tiled.peak_bytes < untiled.peak_bytes if share else \
        tiled.peak_bytes <= untiled.peak_bytes


def _peak_allocated_bytes(run) -> int:
    """The peak of bytes live in torch's CPU allocator while ``run`` runs, from the
    profiler's allocation and free events (decompressed weights live in the working set's
    own mappings, outside it: this is the activations' peak)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def test_the_activation_peak_shrinks_with_a_wide_mlp(wide_models):
    """D 64, intermediate 4096, 128 tokens: an untiled (tokens, intermediate) float32 tensor is
    2 MB and the MLP's backward holds several; with chunks of 256 none is wider than 128 KB."""
    packed = wide_models["llama", "int4", 4096]
    untiled = _peak_allocated_bytes(lambda: step(packed, seq_len=64))
    tiled = _peak_allocated_bytes(lambda: step(packed, seq_len=64,
                                               mlp_intermediate_chunk=256))
    one_wide = 128 * 4096 * 4
    assert untiled - tiled >= 2 * one_wide, (untiled, tiled)


@pytest.mark.parametrize("chunk", [INTERMEDIATE, INTERMEDIATE + 64])
@pytest.mark.parametrize("dtype", ["float32", "bf16-native"])
def test_a_chunk_spanning_every_column_runs_the_untiled_mlp(chunk, dtype, wide_models):
    """The planner prices a chunk >= the intermediate size as untiled: the engine runs it so,
    bit for bit."""
    compute_dtype, knobs = DTYPES[dtype]
    packed = wide_models["llama", "int4"]
    loss, untiled, _ = step(packed, compute_dtype=compute_dtype, **knobs)
    tiled_loss, tiled, _ = step(packed, compute_dtype=compute_dtype,
                                mlp_intermediate_chunk=chunk, **knobs)
    assert tiled_loss == loss
    assert all(torch.equal(tiled[k], untiled[k]) for k in untiled)


def test_a_failing_slice_matmul_gives_its_tile_back(wide_models):
    from mebp_core.engine.frozen_slices import WeightSlice, multiply_slice

    engine = step(wide_models["llama", "int4"], share_decompression=False)[2]
    gate = engine.layers[0].mlp.gate_proj.base
    ws = engine.working_set
    before = ws.live_bytes
    with pytest.raises(RuntimeError):
        multiply_slice(torch.randn(3, gate.in_features + 1), WeightSlice(gate, rows=slice(0, 8)))
    assert ws.live_bytes == before


# peak bytes torch allocates in units of one float32 (N, D), measured: before the partials
# were added in place (forward 16.06 float32, 9.56 bf16-upcast; backward 6.06 float32)
PEAK_UNITS = {"float32": (15.1, 5.6), "bf16-upcast": (9.1, 5.4)}


@pytest.mark.parametrize("dtype", list(PEAK_UNITS))
def test_a_chunk_adds_its_partials_in_place(dtype, wide_models):
    """N 4096 tokens, D 64, chunks of 32: the forward adds down's product and the LoRA delta
    into the float32 sum one at a time (a float32 matmul adds into it itself); the backward
    makes no (N, D) zeros, chunk sum or output * grad product."""
    from mebp_core.engine.mlp_chunks import _mlp_input_grad, run_mlp_by_columns

    compute_dtype, knobs = DTYPES[dtype]
    engine = step(wide_models["llama", "int4"], compute_dtype=compute_dtype,
                  share_decompression=False, **knobs)[2]
    mlp, tokens = engine.layers[0].mlp, 4096
    x = torch.randn(tokens, 64).to(engine.dtype)
    grad_y = torch.randn(tokens, 64).to(engine.dtype)
    unit = tokens * 64 * 4
    forward = _peak_allocated_bytes(lambda: run_mlp_by_columns(mlp, x, 32)) / unit
    backward = _peak_allocated_bytes(lambda: _mlp_input_grad(mlp, x, grad_y, 32)) / unit
    most_forward, most_backward = PEAK_UNITS[dtype]
    assert forward <= most_forward and backward <= most_backward, (forward, backward)


def test_float32_matmul_partials_are_summed_unrounded(wide_models):
    """bf16 storage, float32 matmuls: the chunks' partials reach the float32 sum unrounded,
    so the output is the untiled one (a float32 product rounded once) but for rare
    summation-order flips; rounding each partial to bf16 first flipped 41%."""
    from mebp_core.engine.mlp_chunks import run_mlp_by_columns

    engine = step(wide_models["llama", "int4"], spec=NO_MLP, compute_dtype="bfloat16",
                  bf16_matmul="float32", share_decompression=False)[2]
    mlp = engine.layers[0].mlp
    x = torch.randn(512, 64).to(torch.bfloat16)
    with torch.no_grad():
        untiled = mlp(x)
        tiled = run_mlp_by_columns(mlp, x, 32)
    assert float((tiled != untiled).float().mean()) < 0.02
