"""bfloat16 storage with float32 matmuls (the ``bf16_matmul`` knob): every matmul-like op of a
step runs in float32 while what outlives it (block inputs, outputs) stays bfloat16; the native
setting keeps the projections' matmuls in bfloat16."""

from __future__ import annotations

import pytest
import torch
from engine_fixtures import load_with_random_lora, random_batch
from torch.utils._python_dispatch import TorchDispatchMode

from mebp_core.config import EngineKnobs
from mebp_core.engine.checkpoints import make_checkpoints
from mebp_core.engine.mebp import count_valid_targets, forward_blocks, run_mebp_step
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.workload import Workload, shares_decompression

MATMULS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear",
           "_scaled_dot_product_flash_attention_for_cpu",
           "_scaled_dot_product_flash_attention_for_cpu_backward",
           "_scaled_dot_product_attention_math"}


class MatmulDtypes(TorchDispatchMode):
    """Records the floating dtypes of every matmul-like op dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, set[torch.dtype]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in MATMULS:
            dtypes = {a.dtype for a in args if isinstance(a, torch.Tensor)
                      and a.is_floating_point()}
            self.seen.append((name, dtypes))
        return func(*args, **(kwargs or {}))


def record_step(packed, bf16_matmul: str, **knobs) -> MatmulDtypes:
    engine = load_with_random_lora(packed, compute_dtype="bfloat16",
                                   knobs=EngineKnobs(bf16_matmul=bf16_matmul, **knobs))
    input_ids, labels = random_batch(300, seed=3)
    with MatmulDtypes() as recorder:
        run_mebp_step(engine, input_ids, labels, make_checkpoints("ram"),
                      loss_scale=1.0 / count_valid_targets(labels))
    return recorder


@pytest.mark.parametrize("family", ["qwen2", "gemma3_text"])
@pytest.mark.parametrize("knobs", [{}, {"share_decompression": True},
                                   {"frozen_weights": "resident"}, {"checkpoint_blocks": 2},
                                   {"mlp_chunk_tokens": 8, "share_decompression": True}])
def test_float32_setting_runs_every_matmul_in_float32(family, knobs, packed_models):
    recorder = record_step(packed_models[family, "int4"], "float32", **knobs)
    ops = {name for name, _ in recorder.seen}
    assert {"mm", "_scaled_dot_product_flash_attention_for_cpu_backward"} <= ops
    narrow = [(name, dtypes) for name, dtypes in recorder.seen if dtypes != {torch.float32}]
    assert not narrow, f"matmuls not in float32: {narrow[:5]}"


def test_native_setting_keeps_bfloat16_matmuls(packed_models):
    recorder = record_step(packed_models["qwen2", "int4"], "native")
    assert sum(dtypes == {torch.bfloat16} for _, dtypes in recorder.seen) > 10


def test_float32_setting_keeps_block_inputs_in_bfloat16(packed_models):
    engine = load_with_random_lora(packed_models["llama", "int4"], compute_dtype="bfloat16",
                                   knobs=EngineKnobs(bf16_matmul="float32"))
    checkpoints = make_checkpoints("ram")
    input_ids, _ = random_batch(300, seed=4)
    out = forward_blocks(engine, input_ids, checkpoints)
    assert out.dtype == torch.bfloat16
    saved = [checkpoints.pop(i) for i in reversed(range(len(engine.layers)))]
    assert {t.dtype for t in saved} == {torch.bfloat16}


@pytest.mark.parametrize(("compute_dtype", "bf16_matmul", "shares"),
                         [("bfloat16", "float32", False), ("bfloat16", "native", True),
                          ("float32", "float32", True)])
def test_auto_sharing_holds_no_block_of_weights_when_upcasting(compute_dtype, bf16_matmul,
                                                                shares, packed_models):
    """Upcast tiles cost what decompressing straight to float32 does: "auto" shares only
    when the matmuls run in the storage dtype, and the planner resolves it the same way."""
    engine = load_with_random_lora(packed_models["qwen2", "int4"], compute_dtype=compute_dtype,
                                   knobs=EngineKnobs(bf16_matmul=bf16_matmul))
    assert engine.shares_decompression is shares
    workload = Workload(arch=load_architecture(str(packed_models["qwen2", "int4"])),
                        seq_len=64, compute_dtype=compute_dtype)
    assert shares_decompression(workload, EngineKnobs(bf16_matmul=bf16_matmul)) is shares
    explicit = EngineKnobs(bf16_matmul=bf16_matmul, share_decompression=True)
    assert shares_decompression(workload, explicit) is True
