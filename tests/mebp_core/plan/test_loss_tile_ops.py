"""The ops a step dispatches per vocabulary tile of its loss, which the planner prices on the
host (``dispatch.OPS_PER_LOSS_TILE``), counted on the engine itself: the tiny preset's step
with loss tiles of two sizes, all else the same, for MeBP and MeZO, in float32 and both of
bfloat16's matmul paths. Plain backprop's logits are whole: its tiles cost nothing."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from torch.profiler import ProfilerActivity, profile

from mebp_core.bench.worker import random_batch
from mebp_core.config import EngineKnobs, TrainConfig
from mebp_core.engine.checkpoints import make_checkpoints
from mebp_core.engine.methods import make_step_function
from mebp_core.engine.model import load_engine_model
from mebp_core.engine.train import lora_spec_of, make_block_optimizers
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.dispatch import OPS_PER_LOSS_TILE
from mebp_core.plan.passes import LOSS_PASSES
from mebp_core.plan.timing import step_work
from mebp_core.plan.workload import Workload, matmul_bytes, vocab_tiles
from mebp_core.store.resolve import resolve_model

SEQ_LEN = 32
TILE_BYTES = (64 << 10, 256 << 10)  # the tiny preset's 320 rows in 2-5 tiles and 1-2
# the paths' own counts differ by their casts (float32 67 a MeBP tile, native bf16 75)
TOLERANCE = 0.15


@pytest.fixture(scope="module")
def tiny(warm_cache) -> Path:
    return resolve_model("preset:tiny", cache_dir=warm_cache)


def dispatched_ops(packed: Path, config: TrainConfig) -> int:
    """aten ops of one step after a warm-up step, as torch.profiler counts them."""
    engine = load_engine_model(packed, compute_dtype=config.compute_dtype,
                               lora_spec=lora_spec_of(config), seed=0, knobs=config.knobs)
    with tempfile.TemporaryDirectory() as scratch:
        checkpoints = make_checkpoints(config.knobs.checkpoint_storage, Path(scratch))
        try:
            step = make_step_function(engine, config, make_block_optimizers(engine, config),
                                      checkpoints)
            batch = random_batch(engine.arch.args.vocab_size, SEQ_LEN)
            step(1, [batch], config.lr)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step(2, [batch], config.lr)
        finally:
            checkpoints.close()
            engine.close()
    return sum(event.count for event in prof.key_averages()
               if event.key.startswith("aten::"))


@pytest.mark.parametrize("method", ["mebp", "mezo", "backprop"])
@pytest.mark.parametrize(("dtype", "bf16_matmul"), [
    ("float32", "auto"), ("bfloat16", "native"), ("bfloat16", "float32")])
def test_a_loss_tile_dispatches_what_the_planner_prices(tiny, method, dtype, bf16_matmul):
    arch = load_architecture("preset:tiny")
    counted, priced, tiles = [], [], []
    for tile_bytes in TILE_BYTES:
        knobs = EngineKnobs(frozen_weights="resident", checkpoint_blocks="none",
                            loss_vocab_tile_bytes=tile_bytes, bf16_matmul=bf16_matmul)
        config = TrainConfig(method=method, seq_len=SEQ_LEN, compute_dtype=dtype,
                             knobs=knobs)
        workload = Workload(arch=arch, seq_len=SEQ_LEN, method=method, compute_dtype=dtype)
        counted.append(dispatched_ops(tiny, config))
        priced.append(step_work(workload, knobs, set()).loss_tile_ops)
        tiles.append(vocab_tiles(arch, tile_bytes, matmul_bytes(workload, knobs)))
    assert tiles[0] > tiles[1]  # what is measured: the same step in more tiles
    per_tile = (counted[0] - counted[1]) / (tiles[0] - tiles[1])
    expected = OPS_PER_LOSS_TILE[method] * LOSS_PASSES[method]
    assert per_tile == pytest.approx(expected, rel=TOLERANCE, abs=0.5), (counted, tiles)
    assert priced[0] - priced[1] == (tiles[0] - tiles[1]) * expected
