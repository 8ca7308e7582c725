"""Peak memory by component and step time of one MeBP configuration, from first principles.

Memory follows the engine's phases: the forward and the loss (checkpoints, the head's vocab
tiles and the online-softmax state), then the backward (checkpoints still to be consumed, one
block's activations and gradients, one block's decompressed weights). The peak is the larger
phase on top of what lives throughout: the runtime, resident weights and the LoRA state. Each
component is reported at the peak, so the components add up to it.

Time counts the matrix multiplications (FLOPs over the host's measured rate for that matmul
size and dtype), the decompressions (parameters over the measured rate for the quantization),
the elementwise traffic and the per-op overhead. The structural constants below say how many
bytes an autograd block saves per token and how much elementwise traffic a pass makes; they
are the engine's, not the host's, and ``mebp bench --plan-check`` holds them to measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mebp_core.config import EngineKnobs, TrainConfig
from mebp_core.lora.spec import LoraSpec
from mebp_core.plan.arch import Architecture
from mebp_core.plan.calibration import HostCalibration
from mebp_core.plan.resident import select_resident

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
MB = 1 << 20
# Allocator slack, the store's index, rotary tables and small tensors, above the imports.
RUNTIME_OVERHEAD_BYTES = 12 * MB
# Elementwise passes over a block's activations per forward, in units of its saved bytes.
ELEMENTWISE_PASSES = 3.0
OPS_PER_BLOCK_FORWARD = 100  # torch ops dispatched by one block's forward (backward ~2x)
# Anonymous memory an autograd graph costs per byte of the tensors it saves: the temporaries
# freed between saved tensors leave heap holes the allocator cannot return (measured 1.6-1.7x
# on smollm2-135m and qwen2.5-0.5b, seq 128-512, float32).
GRAPH_RETENTION = 1.65
COMPONENTS = ("runtime", "weights", "checkpoints", "activations", "lora", "loss_chunk")


@dataclass(frozen=True)
class Workload:
    """What the user fixes: the model and the training setting (the knobs are planned)."""

    arch: Architecture
    seq_len: int
    batch_size: int = 1
    lora: LoraSpec = field(default_factory=lambda: LoraSpec(rank=8, alpha=16.0))
    optimizer: str = "sgd"
    compute_dtype: str = "float32"
    quant: str = "int4"
    group_size: int = 64
    fused_update: bool = True  # one micro-batch and no clipping: each block steps at once

    @classmethod
    def from_config(cls, arch: Architecture, config: TrainConfig) -> Workload:
        return cls(arch=arch, seq_len=config.seq_len, batch_size=config.batch_size,
                   lora=LoraSpec(rank=config.lora_rank, alpha=config.lora_alpha,
                                 targets=config.lora_targets),
                   optimizer=config.optimizer, compute_dtype=config.compute_dtype,
                   quant=config.quant, group_size=config.group_size,
                   fused_update=config.grad_accum_steps == 1 and config.max_grad_norm is None)

    @property
    def tokens(self) -> int:
        return self.batch_size * self.seq_len


@dataclass(frozen=True)
class Prediction:
    memory: dict[str, int]  # component -> bytes at the peak
    time: dict[str, float]  # matmul, decompress, elementwise, overhead, disk -> seconds
    store_bytes: int  # the packed file: page cache, not anonymous memory
    flops: float  # matmul work of one step, for on-device estimates

    @property
    def peak_bytes(self) -> int:
        return sum(self.memory.values())

    @property
    def step_time_s(self) -> float:
        return sum(self.time.values())

    def dominant_component(self) -> str:
        return max(self.memory, key=self.memory.get)


def predict(workload: Workload, knobs: EngineKnobs, host: HostCalibration) -> Prediction:
    arch, e = workload.arch, DTYPE_BYTES[workload.compute_dtype]
    n_tokens = workload.tokens
    resident = _resident_weights(arch, knobs, e)
    resident_bytes = sum(resident.values())
    weights = _transient_weights(arch, knobs, e, set(resident))
    every = knobs.checkpoint_blocks
    hidden_bytes = n_tokens * arch.hidden_size * e
    block_saved = int(GRAPH_RETENTION * n_tokens * _saved_bytes_per_token(workload, knobs))
    block_grads = n_tokens * _backward_transient_per_token(workload)
    lora = _lora_bytes(workload, keep_all_grads=every == "none" or not workload.fused_update)
    loss_chunk = _loss_chunk_bytes(workload, knobs)

    if every == "none":
        saved = 0
        activations_fwd = arch.num_layers * block_saved
        activations_bwd = arch.num_layers * block_saved + block_grads
        weights_bwd = weights["tile"]
    else:
        slots = math.ceil(arch.num_layers / every)
        saved = slots * hidden_bytes if knobs.checkpoint_storage == "ram" else hidden_bytes
        activations_fwd = 0
        # one block recomputed under autograd, its gradients, the segment's re-run inputs
        activations_bwd = block_saved + block_grads + (every - 1) * hidden_bytes
        weights_bwd = weights["block"] + (weights["tile"] if every > 1 or
                                          not knobs.share_decompression else 0)
    forward_phase = {"weights": weights["tile"], "activations": activations_fwd,
                     "loss_chunk": loss_chunk}
    backward_phase = {"weights": weights_bwd, "activations": activations_bwd, "loss_chunk": 0}
    phase = max((forward_phase, backward_phase), key=lambda p: sum(p.values()))
    memory = {"runtime": host.runtime_anon_bytes + RUNTIME_OVERHEAD_BYTES,
              "weights": resident_bytes + phase["weights"], "checkpoints": saved,
              "activations": phase["activations"], "lora": lora,
              "loss_chunk": phase["loss_chunk"]}
    store_bytes = _store_bytes(arch, workload)
    time, flops = _step_time(workload, knobs, host, resident)
    return Prediction(memory=memory, time=time, store_bytes=store_bytes, flops=flops)


def _resident_weights(arch: Architecture, knobs: EngineKnobs, e: int) -> dict[str, int]:
    if knobs.frozen_weights != "resident":
        return {}
    sizes = {name: params * e for name, params in arch.frozen_weights()}
    return {name: sizes[name]
            for name in select_resident(sizes.items(), knobs.resident_weight_bytes)}


def _transient_weights(arch: Architecture, knobs: EngineKnobs, e: int,
                       resident: set[str]) -> dict[str, int]:
    """The tile arena (largest lazy tile, forward and head) and one block's shared weights."""
    tile = 0
    block = 0
    for name, params in arch.frozen_weights():
        if name in resident:
            continue
        rows, cols = _shape_of(arch, name)
        tile_bytes = knobs.loss_vocab_tile_bytes if "layers" not in name \
            else knobs.decompress_tile_bytes
        tile_rows = max(1, min(rows, tile_bytes // (cols * e)))
        tile = max(tile, tile_rows * cols * e)
        if knobs.share_decompression and name.startswith("model.layers.0."):
            block += params * e
    return {"tile": tile, "block": block}


def _shape_of(arch: Architecture, name: str) -> tuple[int, int]:
    if "layers" not in name:
        return arch.vocab_size, arch.hidden_size
    return arch.projections()[name.split(".")[-2]]


def _adapted(workload: Workload) -> dict[str, tuple[int, int]]:
    suffixes = {suffix.split(".")[-1] for suffix in workload.lora.module_suffixes()}
    return {s: shape for s, shape in workload.arch.projections().items() if s in suffixes}


def _saved_bytes_per_token(workload: Workload, knobs: EngineKnobs) -> float:
    """Bytes one block's autograd graph keeps per token (attention scores included)."""
    arch, e = workload.arch, DTYPE_BYTES[workload.compute_dtype]
    d, i = arch.hidden_size, arch.intermediate_size
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    norms = 2 * (d * e + 2 * d * 4)  # input, float32 copy and normalized float32 copy
    attention = e * (3 * q + 2 * kv)  # rotated q, k, v, the attention output, its copy
    mlp = e * 4 * i  # gate, up, activation, product
    if arch.model_type in ("qwen3", "gemma3_text"):
        attention += 4 * (q + kv) + e * (q + kv)  # q/k norms
    if arch.model_type == "gemma3_text":
        norms += 2 * (d * e + 2 * d * 4)
    per_token = norms + attention + mlp
    if arch.sliding_layers:  # a masked layer takes SDPA's math path: scores are materialized
        share = arch.sliding_layers / arch.num_layers
        per_token += share * 2 * arch.num_heads * workload.seq_len * e
    if knobs.lora_hidden == "store":
        per_token += e * workload.lora.rank * len(_adapted(workload))
    return per_token


def _backward_transient_per_token(workload: Workload) -> float:
    """Gradients alive at once inside a block's backward (MLP-sized ones dominate)."""
    arch, e = workload.arch, DTYPE_BYTES[workload.compute_dtype]
    return e * (3 * arch.intermediate_size + 3 * arch.hidden_size)


def _lora_bytes(workload: Workload, *, keep_all_grads: bool) -> int:
    per_block = sum(workload.lora.rank * (inp + out) * 4 for out, inp in
                    _adapted(workload).values())
    params = per_block * workload.arch.num_layers
    grads = params if keep_all_grads else per_block
    optimizer = 2 * params if workload.optimizer == "adamw" else 0
    return params + grads + optimizer


def _loss_chunk_bytes(workload: Workload, knobs: EngineKnobs) -> int:
    """One vocabulary tile's float32 logits, probabilities and their cast, plus the per-token
    running state and the (N, D) float32 gradient accumulator."""
    arch, e = workload.arch, DTYPE_BYTES[workload.compute_dtype]
    tile_rows = max(1, min(arch.vocab_size, knobs.loss_vocab_tile_bytes // (arch.hidden_size * e)))
    n = workload.tokens
    return n * tile_rows * (4 + 4 + e) + 3 * n * arch.hidden_size * 4


def _decompress_calls(workload: Workload, knobs: EngineKnobs, resident: set[str],
                      block_decompressions: int) -> float:
    """Dequantization calls per step: one per tile, or one per projection when shared."""
    arch, e = workload.arch, DTYPE_BYTES[workload.compute_dtype]
    per_block = 0
    head = 0
    for name, _ in arch.frozen_weights():
        if name in resident:
            continue
        rows, cols = _shape_of(arch, name)
        if "layers" in name:
            if name.startswith("model.layers.0."):
                per_block += math.ceil(rows / max(1, knobs.decompress_tile_bytes // (cols * e)))
        else:
            head = math.ceil(rows / max(1, knobs.loss_vocab_tile_bytes // (cols * e)))
    return per_block * block_decompressions * \
        (sum(1 for n, _ in arch.frozen_weights() if n not in resident and "layers" in n)
         / max(1, 7 * arch.num_layers)) + head


def _store_bytes(arch: Architecture, workload: Workload) -> int:
    bits = {"int4": 4, "int8": 8, "none": 16}[workload.quant]
    overhead = 0 if workload.quant == "none" else 2 * 2 / workload.group_size  # fp16 scale+bias
    return int(arch.parameter_count() * (bits / 8 + overhead))


def _pass_counts(workload: Workload, knobs: EngineKnobs) -> tuple[int, int, int]:
    """Block forwards, block backwards, and re-run forwards (segments) per step."""
    layers, every = workload.arch.num_layers, knobs.checkpoint_blocks
    if every == "none":
        return layers, layers, 0
    extra = sum(min(every, layers - first) - 1 for first in range(0, layers, every))
    return layers + extra + layers, layers, extra  # forward, re-runs, recompute


def count_step_flops(workload: Workload, knobs: EngineKnobs) -> float:
    """Matmul FLOPs of one step: frozen projections, LoRA branches, attention, the head."""
    arch, n = workload.arch, workload.tokens
    forwards, backwards, _ = _pass_counts(workload, knobs)
    frozen = 2 * n * arch.block_params()
    lora = sum(2 * n * workload.lora.rank * (inp + out) for out, inp in _adapted(workload).values())
    attention = 2 * n * workload.seq_len * arch.num_heads * arch.head_dim  # causal: half of 4
    per_forward = frozen + lora + attention
    per_backward = frozen + 2.5 * lora + 2.5 * attention  # input grads; LoRA A/B grads
    head = 4 * n * arch.vocab_size * arch.hidden_size  # logits, then the gradient accumulator
    return forwards * per_forward + backwards * per_backward + head


def _step_time(workload: Workload, knobs: EngineKnobs, host: HostCalibration,
               resident: dict[str, int]) -> tuple[dict[str, float], float]:
    arch, dtype = workload.arch, workload.compute_dtype
    n = workload.tokens
    layers = arch.num_layers
    forwards, backwards, extra_forwards = _pass_counts(workload, knobs)
    flops = count_step_flops(workload, knobs)
    matmul_s = flops / host.matmul_rate(dtype, n)

    lazy_block_params = sum(params for name, params in arch.frozen_weights()
                            if "layers" in name and name not in resident)
    if knobs.checkpoint_blocks == "none":
        block_decompressions = 2 * layers
    else:
        shared = 1 if knobs.share_decompression else 2
        block_decompressions = layers + extra_forwards + shared * layers
    head_params = 0 if arch.head_weight_name() in resident else arch.head_params()
    decompress_s = (block_decompressions * lazy_block_params / layers + head_params) / \
        host.decompress_rate(workload.quant, dtype)

    e = DTYPE_BYTES[dtype]
    block_traffic = n * _saved_bytes_per_token(workload, knobs) * ELEMENTWISE_PASSES
    logits_traffic = n * arch.vocab_size * (4 * 6 + e)
    elementwise_s = ((forwards + 2 * backwards) * block_traffic + logits_traffic) / \
        host.elementwise_bytes_per_s
    overhead_s = (forwards + 2 * backwards) * OPS_PER_BLOCK_FORWARD * host.op_overhead_s
    decompress_s += _decompress_calls(workload, knobs, set(resident), block_decompressions) * \
        (host.decompress_call_s + 3 * host.op_overhead_s)
    return {"matmul": matmul_s, "decompress": decompress_s, "elementwise": elementwise_s,
            "overhead": overhead_s}, flops
