"""A block's backward holds what the planner counts for it, as the kernel counts it, in each
family's normalization layout: one norm in the attention part (Llama), q/k norms (Qwen3),
and Gemma 3's four norms, q/k norms and sliding window. Each is a few blocks of a preset's
width (vocabulary cut to 256), packed, stepped once at 2048 tokens in a fresh process.
Without the q/k and post-attention norms counted, the whole qwen3-0.6b peaked 19% and
gemma3-1b 11% above the prediction there (BENCHMARKS.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import transformers

from mebp_core.allocator import ALLOCATOR_ENV
from mebp_core.config import EngineKnobs
from mebp_core.plan.arch import architecture_from_config
from mebp_core.plan.predict import RUNTIME_OVERHEAD_BYTES, predict
from mebp_core.plan.workload import Workload
from mebp_core.store.pack import pack_model
from mebp_core.store.preset_configs import PRESET_CONFIGS
from mebp_core.units import MB

SEQ_LEN = 2048
# a single block peaks lower than the same block among others (the heap's holes build up
# block after block: gemma3-1b's footprint at 2048 tokens was 197 MB with one, 257 with four
# and 298 with all 26); four come within 1% for Qwen3 and 12-14% under for the others on a
# Zen 4 host, and smollm2's 25% under on another CI host
LAYERS = 4
MARGIN = 0.10  # the planner's default safety margin: a cap of peak * (1 + margin) holds
# the lazy front configuration, where one block's activations are most of the footprint
LAZY = EngineKnobs(frozen_weights="lazy", checkpoint_blocks=1, checkpoint_storage="mmap",
                   lora_hidden="recompute", share_decompression=False, mlp_chunk_tokens=64,
                   decompress_tile_bytes=1 << 20, loss_vocab_tile_bytes=1 << 20)
# the same, its MLP a chunk of intermediate columns at a time over every token: at 2048
# tokens, the columns of 64 tokens' worth
BY_COLUMNS = LAZY.model_copy(update={"mlp_chunk_tokens": None, "mlp_intermediate_chunk": 64})


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "knobs"), [
    pytest.param(preset, knobs, id=f"{preset}-{name}")
    for preset, knobs, name in [("smollm2-135m", LAZY, "tokens"), ("qwen3-0.6b", LAZY, "tokens"),
                                ("gemma3-1b", LAZY, "tokens"),
                                ("smollm2-135m", BY_COLUMNS, "columns"),
                                ("qwen3-0.6b", BY_COLUMNS, "columns")]])
def test_one_blocks_backward_peaks_within_the_planners_count(tmp_path, host, preset, knobs):
    config = {**PRESET_CONFIGS[preset], "num_hidden_layers": LAYERS,
              "vocab_size": 256}
    if "layer_types" in config:
        config["layer_types"] = config["layer_types"][:LAYERS]  # gemma3-1b's: sliding
    fields = {k: v for k, v in config.items() if k != "model_type"}
    hf_config = transformers.AutoConfig.for_model(config["model_type"], **fields)
    transformers.AutoModelForCausalLM.from_config(hf_config).save_pretrained(tmp_path / "hf")
    packed = pack_model(tmp_path / "hf", tmp_path / "packed", quant="int4")
    dumped = knobs.model_dump(mode="json", exclude_defaults=True)
    proc = subprocess.run(
        [sys.executable, "-m", "mebp_core.bench.worker", "mebp", "--model", str(packed),
         "--seq-len", str(SEQ_LEN), "--steps", "1", "--threads", "1", "--dtype", "bfloat16",
         "--knobs", json.dumps(dumped)], capture_output=True, text=True, check=True,
        # glibc's malloc, whose heap holes the block's terms were fitted to; under jemalloc
        # the kernel counts 0.50-0.58 of them at these 2048 tokens (an over-count, a bound:
        # plan/heap_retention.py, JEMALLOC_GRAPH_RETENTION)
        env={**os.environ, ALLOCATOR_ENV: "glibc"})
    measured = json.loads(proc.stdout)

    arch = architecture_from_config(hf_config.to_dict())
    prediction = predict(Workload(arch=arch, seq_len=SEQ_LEN, compute_dtype="bfloat16"),
                         knobs, host)
    # above the imports, where the seeded host's runtime is not this process's
    predicted_mb = (prediction.peak_bytes - host.runtime_bytes) / MB
    activations_mb = prediction.memory["activations"] / MB
    # the block's terms are what is checked (beside what native bf16 matmuls keep at 2048
    # tokens where the CPU has them: this host's oneDNN, not the block)
    kept_mb = (prediction.memory["runtime"] - host.runtime_bytes - RUNTIME_OVERHEAD_BYTES) / MB
    assert activations_mb > 0.5 * (predicted_mb - kept_mb)
    assert measured["footprint_mb"] <= predicted_mb + MARGIN * (
        predicted_mb + measured["post_import_mb"]), (measured["footprint_mb"], predicted_mb)
    # an over-count is safe; this bound only keeps the block's count from growing out of
    # touch (native bf16's kept bytes are a bound over oneDNN's cache, 71 MB at 2048 tokens
    # where 58 were seen: with them, smollm2's 100 MB fell under 0.6 of 173 on a CI host)
    assert measured["footprint_mb"] >= 0.6 * (predicted_mb - kept_mb), (
        measured["footprint_mb"], predicted_mb, kept_mb)
