"""Peak memory by component and step time of one MeBP configuration, from first principles
(the time model is in ``timing``).

Memory is what the kernel charges (anonymous + shared). It follows the engine's phases: the
forward and the loss (checkpoints, the head's vocab tiles and the online-softmax state), then
the backward (the checkpoints, counted whole as at its start, one block's activations and
gradients, one block's decompressed weights). A graph tail's blocks keep their activations
from their forward, through the loss, to their backward, which runs before the checkpointed
blocks': its phases are the whole-graph step's, for the tail's blocks. The peak is the
larger phase on top of what lives throughout: the runtime, resident weights and the LoRA
state. Each component is reported at the peak, so the components add up to it. Storage is
in the compute dtype, matmuls and lazy tiles in the matmul dtype (float32 for bfloat16 on
hosts without bf16 matmul instructions).

The structural constants below are the engine's, not the host's; ``mebp bench --plan-check``
holds them to measurement.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from mebp_core.config import EngineKnobs
from mebp_core.plan.arch import Architecture
from mebp_core.plan.calibration import HostCalibration
from mebp_core.plan.correction import TimeCorrection
from mebp_core.plan.heap_retention import (
    GRAPH_RETENTION,
    NATIVE_BF16_PLAIN_CHAIN_RETENTION,
    HeapRetention,
    heap_retention,
)
from mebp_core.plan.store_reads import (
    direct_read_cost_bytes,
    file_room_bytes,
    lazy_head_bytes,
    lazy_store_bytes,
    mapped_reread_bytes,
    reads_direct,
    staging_bytes,
    step_read_bytes,
)
from mebp_core.plan.timing import StepWork, step_time, step_work
from mebp_core.plan.weight_memory import Residency, resident_weights, transient_weights
from mebp_core.plan.workload import (
    DTYPE_BYTES,
    MLP_PROJECTIONS,
    Workload,
    adapted_projections,
    graph_tail_blocks,
    lora_parameters_per_block,
    matmul_bytes,
    matmul_dtype_of,
    mlp_chunk_tokens,
    mlp_intermediate_width,
    mlp_output_passes,
    saved_bytes_per_token_by_part,
    shares_decompression,
    tile_rows,
)
from mebp_core.units import MB

# What a training run holds above its imports and the modelled tensors: the data, allocator
# slack, the store's index, rotary tables, small tensors. Fitted by least squares on the
# kernel's count together with the per-token terms of ``_backward_transient_bytes`` and
# NATIVE_BF16_BYTES: 30 uncapped runs of the smallest configurations, whole and in MLP
# chunks of 64 (smollm2-135m, qwen2.5-0.5b, gemma3-1b and qwen2.5-1.5b at seq 256,
# qwen2.5-0.5b at 1024; float32, native bf16 and upcast bf16), each then within -6.1%..+6.0%
# (2-core Xeon with AMX, 2026-12-01; BENCHMARKS.md).
RUNTIME_OVERHEAD_BYTES = 22 * MB
# What native bf16 matmuls keep beyond the same run in float32 (same fit: 19 MB; disabling
# AMX in oneDNN took off only 5 MB of it). On a Zen 4 with avx512_bf16 the native rows of the
# earlier fit were over-predicted, so this may be host-specific: refit when it is.
# It is oneDNN's cached primitives (ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 frees it, at 4-7x the
# step time; 25 matmul shapes a step), and past 256 tokens it grows with them: the smallest
# configuration of qwen2.5-0.5b on an AMX Xeon (2026-12-05) kept 17.6, 17.4, 33.2, 30.1 and
# 57.8 MB at 256, 512, 768, 1024 and 2048 tokens (one sequence each: oneDNN caches by
# shape, and a batch's tokens are taken alike, unmeasured). NATIVE_BF16_BYTES_PER_TOKEN past
# 256: a bound over those runs (33.5 MB at 768; 9-12 MB over at 512, 1024 and 2048), not a
# fit. Counted flat, the seq-1024 pick at S was OOM-killed under its cap in 2 runs of 2
# (BENCHMARKS, "MLP column chunks of equal width"). That growth was glibc's heap: under
# jemalloc (same host, 2026-12-05) the native rows at 512-2048 tokens are within the
# planner's other terms without it (``heap_retention.JEMALLOC_TRANSIENT_RETENTION``).
NATIVE_BF16_BYTES = 19 * MB
NATIVE_BF16_BYTES_PER_TOKEN = MappingProxyType({"glibc": 29 << 10, "jemalloc": 0})
NATIVE_BF16_FLAT_TOKENS = 256
# No-grad forward temporaries of a block's MLP, in (tokens, intermediate) tensors: gate, up,
# their product and the LoRA branch's output. FORWARD_RETENTION: allocator holes between them.
FORWARD_MLP_COPIES = 4
FORWARD_RETENTION = 1.0
# Float32 (N, V) tensors plain backprop's loss holds at once, at the start of its backward: the
# log-softmax it kept, the gradient into it and the gradient out of it. A 16-bit matmul's
# (N, V) output is cast and freed before that (measured alone on an AMX Xeon: 12.0 bytes per
# logit at the backward's peak in bfloat16 and float32 alike, 8 in the forward).
FULL_LOGITS_FLOAT32_COPIES = 3
COMPONENTS = ("runtime", "weights", "checkpoints", "activations", "lora", "loss_chunk")


@dataclass(frozen=True)
class Prediction:
    memory: dict[str, int]  # component -> bytes at the peak
    time: dict[str, float]  # matmul, decompress, elementwise, overhead, disk -> seconds
    store_bytes: int  # packed bytes a mapped step reads: page cache, not anonymous memory
    # what a mapped step reads of the store when none of it stays cached (``store_reads``)
    store_read_bytes: float
    checkpoint_file_bytes: int  # checkpoints in a memory-mapped file: dirty page cache
    device_work: StepWork  # what the step does on a phone, for on-device estimates
    modelled_time: dict[str, float]  # ``time`` before the host's measured-run correction
    correction: TimeCorrection | None = None  # what measured runs on this host say
    # direct reads (``store_reads``) priced as bytes read at the disk's rate
    direct_read_cost_bytes: float = 0

    @property
    def modelled_step_time_s(self) -> float:
        """The step time before the host's correction: what measured runs are compared to."""
        return sum(self.modelled_time.values())

    @property
    def time_factor(self) -> float:
        """The correction's overall effect on this configuration's step time."""
        modelled = self.modelled_step_time_s
        return self.step_time_s / modelled if modelled > 0 else 1.0

    @property
    def peak_bytes(self) -> int:
        return sum(self.memory.values())

    @property
    def step_time_s(self) -> float:
        return sum(self.time.values())

    def dominant_component(self) -> str:
        return max(self.memory, key=self.memory.get)


def predict(workload: Workload, knobs: EngineKnobs, host: HostCalibration) -> Prediction:
    """Peak memory by component and step time of ``workload.method`` with these knobs."""
    e = DTYPE_BYTES[workload.compute_dtype]
    resident = resident_weights(workload.arch, knobs, e)
    matmul = matmul_dtype_of(workload, knobs)
    if workload.method == "mezo":
        memory, checkpoint_file = _mezo_memory(workload, knobs, resident), 0
    else:
        heap = heap_retention(host.allocator, matmul == "bfloat16")
        memory, checkpoint_file = _gradient_memory(workload, knobs, resident, heap)
    native_bf16 = native_bf16_bytes(workload, host.allocator) if matmul == "bfloat16" else 0
    memory = {"runtime": host.runtime_bytes + RUNTIME_OVERHEAD_BYTES + native_bf16, **memory}
    store_bytes = lazy_store_bytes(workload, resident.names)
    read_bytes = step_read_bytes(workload, store_bytes,
                                 lazy_head_bytes(workload, resident.names))
    modelled, work = step_time(workload, knobs, host, resident.names)
    direct_reads = 0.0
    if reads_direct(knobs, store_bytes):  # staging buffers, no page cache
        memory["weights"] += staging_bytes(workload)
        direct_reads = direct_read_cost_bytes(workload, knobs, read_bytes,
                                              host.read_ahead_cost)
        modelled = {**modelled, "disk": direct_reads / host.disk_read_bytes_per_s}
        store_bytes, read_bytes = 0, 0.0
    if matmul_bytes(workload, knobs) != e:
        # a phone runs its 16-bit matmuls natively: it never pays this host's upcasts
        work = step_work(workload, knobs.model_copy(update={"bf16_matmul": "native"}),
                         resident.names)
    correction = host.time_corrections.get(matmul)
    time = modelled if correction is None else correction.apply(modelled)
    return Prediction(memory=memory, time=time, store_bytes=store_bytes,
                      store_read_bytes=read_bytes,
                      checkpoint_file_bytes=checkpoint_file, device_work=work,
                      modelled_time=modelled, correction=correction,
                      direct_read_cost_bytes=direct_reads)


def native_bf16_bytes(workload: Workload, allocator: str) -> int:
    """What native bf16 matmuls keep of their own at this workload's tokens, under
    ``allocator``."""
    extra_tokens = max(0, workload.tokens - NATIVE_BF16_FLAT_TOKENS)
    return NATIVE_BF16_BYTES + NATIVE_BF16_BYTES_PER_TOKEN[allocator] * extra_tokens


def _gradient_memory(workload: Workload, knobs: EngineKnobs, resident: Residency,
                     heap: HeapRetention) -> tuple[dict[str, int], int]:
    """MeBP's (and plain backprop's) components above the runtime, and the bytes of
    checkpoints kept in a mapped file, under an allocator that keeps ``heap``."""
    arch, e = workload.arch, DTYPE_BYTES[workload.compute_dtype]
    em = matmul_bytes(workload, knobs)
    upcast = em != e  # held weights are upcast a tile at a time, inputs per matmul
    shared = shares_decompression(workload, knobs)
    n_tokens = workload.tokens
    every, tail = knobs.checkpoint_blocks, graph_tail_blocks(workload, knobs)
    if tail == arch.num_layers:  # the engine runs the whole-graph step
        every, tail = "none", 0
    # a tail's blocks are decompressed in tiles: only the checkpointed ones share
    weights = transient_weights(arch, knobs, e, em, resident.names, shared,
                                 arch.num_layers - tail, mlp_intermediate_width(workload, knobs))
    hidden_bytes = n_tokens * arch.hidden_size * e
    # the MLP part of a block's backward runs a chunk of tokens, or of intermediate
    # columns over every token, at a time if asked
    chunk, width = mlp_chunk_tokens(workload, knobs), mlp_intermediate_width(workload, knobs)
    saved_per_token = saved_bytes_per_token_by_part(workload, knobs, width)
    saved_tensors = n_tokens * saved_per_token["attention"] + chunk * saved_per_token["mlp"]
    block_saved = int(heap.graph * saved_tensors)  # one block recomputed alone
    block_grads = heap.transient * _backward_transient_bytes(workload, em, n_tokens, chunk,
                                                             width)
    # a tiled input gradient's running sum, (N, in); when upcasting, in the matmul dtype
    # beside its cast back (the LoRA branch upcasts a bounded chunk of rows at a time)
    widest = _widest_inputs(arch)
    widest_mlp = widest["mlp"] if width == arch.intermediate_size else \
        max(arch.hidden_size, width)  # down's input is a chunk's columns
    running_sum = max(n_tokens * widest["attention"], chunk * widest_mlp) * \
        (em + e if upcast else e)
    if upcast or every == "none" or not shared:
        block_grads += running_sum
    if chunk < n_tokens:
        block_grads += hidden_bytes  # the MLP part's input gradient, gathered whole
    if width < arch.intermediate_size:  # ... or summed over the column chunks in float32
        block_grads += n_tokens * arch.hidden_size * 4
    # the MLP's output made first for a backward in column chunks, summed in float32
    block_grads += mlp_output_passes(arch, width) * n_tokens * arch.hidden_size * (4 + e)
    # fused updates step each block as its gradients complete: a tail's all at once
    lora = _lora_bytes(workload, grad_blocks=arch.num_layers
                       if every == "none" or not workload.fused_update else max(1, tail))
    loss = full_logits_bytes(workload) if workload.method == "backprop" else \
        loss_chunk_bytes(workload, knobs, em)

    if every == "none":
        saved = 0
        activations_fwd = _chained_graph_bytes(workload, knobs, arch.num_layers, heap)
        activations_bwd = activations_fwd + block_grads
        weights_bwd = weights["tile"]
    else:
        checkpointed = arch.num_layers - tail
        slots = math.ceil(checkpointed / every)
        saved = slots * hidden_bytes if knobs.checkpoint_storage == "ram" else hidden_bytes
        # a tail's graph lives through the loss (its running sum: the tail's backward is tiled)
        activations_fwd = _chained_graph_bytes(workload, knobs, tail, heap)
        # one block recomputed under autograd, its gradients, the segment's re-run inputs
        segment = min(every, checkpointed)
        block = block_saved + block_grads
        if chunk == n_tokens and width == arch.intermediate_size:
            block = int(heap.whole_mlp_block * block)
        activations_bwd = block + (segment - 1) * hidden_bytes
        tiles_in_backward = upcast or not shared
        weights_bwd = weights["block"] + (weights["tile"] if tiles_in_backward else 0)
    forward_phase = {"weights": weights["tile"], "activations": activations_fwd,
                     "loss_chunk": loss}
    backward_phase = {"weights": weights_bwd, "activations": activations_bwd, "loss_chunk": 0}
    phases = [forward_phase, backward_phase]
    if tail:
        tail_grads = heap.transient * _backward_transient_bytes(workload, em, n_tokens,
                                                                n_tokens) + running_sum
        phases.append({"weights": weights["tile"],
                       "activations": activations_fwd + tail_grads, "loss_chunk": 0})
    phase = max(phases, key=lambda p: sum(p.values()))
    memory = {"weights": resident.bytes + phase["weights"], "checkpoints": saved,
              "activations": phase["activations"], "lora": lora,
              "loss_chunk": phase["loss_chunk"]}
    checkpoint_file = 0
    if every != "none" and knobs.checkpoint_storage == "mmap":
        checkpoint_file = math.ceil((arch.num_layers - tail) / every) * hidden_bytes
    return memory, checkpoint_file


def _chained_graph_bytes(workload: Workload, knobs: EngineKnobs, blocks: int,
                         heap: HeapRetention) -> int:
    """Anonymous memory of ``blocks`` whole blocks' graphs alive at once: each MLP's gate and
    up alone, but plain backprop's, which keeps what a plain trainer's graph keeps."""
    plain = workload.method == "backprop"
    saved_per_block = workload.tokens * sum(saved_bytes_per_token_by_part(
        workload, knobs, chained=not plain).values())
    native_bf16 = matmul_dtype_of(workload, knobs) == "bfloat16"
    if plain:
        retention = NATIVE_BF16_PLAIN_CHAIN_RETENTION if native_bf16 else GRAPH_RETENTION
        return blocks * int(retention * saved_per_block)
    onset = heap.chain_onset_blocks if blocks else 0
    return int((blocks + onset) * int(heap.chain * saved_per_block))


def _mezo_memory(workload: Workload, knobs: EngineKnobs, resident: Residency
                 ) -> dict[str, int]:
    """MeZO's components above the runtime: inference's. Two forwards without autograd (one
    block's temporaries at a time, then the head's loss tiles without a gradient), the LoRA
    parameters alone (no gradients, no optimizer state) and one parameter's drawn z."""
    arch, e = workload.arch, DTYPE_BYTES[workload.compute_dtype]
    em = matmul_bytes(workload, knobs)
    weights = transient_weights(arch, knobs, e, em, resident.names, shared=False,
                                 mlp_width=mlp_intermediate_width(workload, knobs))
    blocks = forward_block_bytes(workload, knobs, em)
    loss = loss_chunk_bytes(workload, knobs, em, with_grad=False)
    adapted = adapted_projections(workload).values()
    largest_z = max((workload.lora.rank * max(out, inp) for out, inp in adapted), default=0)
    lora = 4 * (workload.arch.num_layers * lora_parameters_per_block(workload) + largest_z)
    return {"weights": resident.bytes + weights["tile"], "checkpoints": 0,
            "activations": blocks, "lora": lora, "loss_chunk": loss}


def forward_block_bytes(workload: Workload, knobs: EngineKnobs, em: int) -> int:
    """One block's forward without autograd at its widest: the hidden states in and out and
    the MLP's (tokens, intermediate) temporaries (gate, up and their product, the LoRA
    branch's output beside them), or the attention's q, k, v, rotated copies and output,
    whichever is larger; matmul outputs in the matmul dtype."""
    arch, e = workload.arch, DTYPE_BYTES[workload.compute_dtype]
    n = workload.tokens
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    attention = n * (em * (2 * q + 4 * kv) + e * q)
    width = mlp_intermediate_width(workload, knobs)
    mlp = mlp_chunk_tokens(workload, knobs) * FORWARD_MLP_COPIES * em * width
    if width < arch.intermediate_size:  # down's output summed over the chunks in float32
        mlp += n * arch.hidden_size * 4
    return int(FORWARD_RETENTION * (2 * n * arch.hidden_size * e + max(attention, mlp)))


@lru_cache(maxsize=64)
def _widest_inputs(arch: Architecture) -> Mapping[str, int]:
    """The widest input of a block's attention projections and of its MLP's."""
    return MappingProxyType({part: max(inp for suffix, (_, inp) in arch.projections().items()
                                       if (suffix in MLP_PROJECTIONS) == (part == "mlp"))
                             for part in ("attention", "mlp")})


def _backward_transient_bytes(workload: Workload, em: int, n_tokens: int,
                              mlp_tokens: int, mlp_width: int | None = None) -> float:
    """Gradients and temporaries alive at once inside a block's backward: MLP-sized gradients
    and a dozen hidden-sized ones in the storage dtype (the single-block backward peaks ~2x
    above its saved tensors: smollm2-135m and qwen2.5-0.5b, seq 128-512), the attention
    part's norm gradients in float32 whatever the dtype (12 bytes per token and normalized
    element: the hidden size for Llama and Qwen2, 3.1x it for gemma3-1b, 4x for qwen3-0.6b),
    and MLP-sized ones in the matmul dtype (1.15 per token: the MLP's input gradients from
    the frozen and LoRA paths and their sum); the last two fitted with
    RUNTIME_OVERHEAD_BYTES. The MLP-sized ones exist for the ``mlp_tokens`` and
    ``mlp_width`` intermediate columns (all by default) of one MLP pass."""
    arch, e = workload.arch, DTYPE_BYTES[workload.compute_dtype]
    return n_tokens * (e * 12 * arch.hidden_size + 12 * arch.attention_norm_width()) + \
        mlp_tokens * (e * 4 + em * 1.15) * (mlp_width or arch.intermediate_size)


def _lora_bytes(workload: Workload, *, grad_blocks: int) -> int:
    """Float32 LoRA parameters, the gradients of ``grad_blocks`` blocks, AdamW's moments."""
    per_block = 4 * lora_parameters_per_block(workload)
    params = per_block * workload.arch.num_layers
    grads = per_block * grad_blocks
    optimizer = 2 * params if workload.optimizer == "adamw" else 0
    return params + grads + optimizer


def loss_chunk_bytes(workload: Workload, knobs: EngineKnobs, em: int, *,
                     with_grad: bool = True) -> int:
    """The loss's reused tile buffers (float32 logits, turned into probabilities in place,
    and their twin in a 16-bit matmul dtype), a softcap's slope beside them, and the
    per-token running state and, for a gradient, the (N, D) float32 accumulator."""
    arch = workload.arch
    rows = tile_rows(arch.vocab_size, arch.hidden_size, knobs.loss_vocab_tile_bytes, em)
    per_element = 4 + (em if em != 4 else 0) + (4 if arch.logit_softcap and with_grad else 0)
    n = workload.tokens
    return n * rows * per_element + (3 if with_grad else 1) * n * arch.hidden_size * 4


def full_logits_bytes(workload: Workload) -> int:
    """Plain backprop's loss at its peak: the (N, V) float32 tensors cross-entropy keeps and
    makes in its backward, whatever the matmul dtype."""
    n, vocab = workload.tokens, workload.arch.vocab_size
    return n * vocab * FULL_LOGITS_FLOAT32_COPIES * 4


def under_budget(prediction: Prediction, budget_bytes: int, host: HostCalibration
                 ) -> Prediction:
    """The prediction with the disk traffic a cap forces. File pages share the budget with
    anonymous memory: the runtime's first, then checkpoints in a mapped file (what does not
    fit is written back and read again), then the store (what does not fit is read again by
    every sweep); a direct step's own reads beside them."""
    room = file_room_bytes(budget_bytes, prediction.peak_bytes)
    checkpoints = prediction.checkpoint_file_bytes
    missing_checkpoints = max(0, checkpoints - room)
    rereads = mapped_reread_bytes(prediction.store_bytes, prediction.store_read_bytes,
                                  room - checkpoints, host.disk_read_bytes_per_s)
    disk = {"disk": (rereads + 2 * missing_checkpoints + prediction.direct_read_cost_bytes)
            / host.disk_read_bytes_per_s}
    corrected = disk if prediction.correction is None else \
        prediction.correction.apply(disk, like={**prediction.modelled_time, **disk})
    return dataclasses.replace(prediction, time={**prediction.time, **corrected},
                               modelled_time={**prediction.modelled_time, **disk})
