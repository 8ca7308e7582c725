"""The workload the planner predicts: a model and a training setting, and what follows from
them alone (adapted projections, the bytes one block's autograd graph saves per token)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType

from mebp_core.config import EngineKnobs, Method, TrainConfig
from mebp_core.cpu import matmul_dtype
from mebp_core.lora.spec import TARGET_SUFFIXES, LoraSpec
from mebp_core.plan.arch import Architecture, PlanInputError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
# the TrainConfig fields a plan query names (the model aside): what the predictions depend on
# besides the knobs; the planner takes the other fields at their defaults
PLAN_QUERY_FIELDS = ("seq_len", "batch_size", "lora_rank", "lora_alpha", "lora_targets",
                     "optimizer", "compute_dtype", "quant", "group_size")


@dataclass(frozen=True)
class Workload:
    """What the user fixes: the model, the method and the training setting (the knobs are
    planned)."""

    arch: Architecture
    seq_len: int
    method: Method = "mebp"
    batch_size: int = 1
    lora: LoraSpec = field(default_factory=lambda: LoraSpec(rank=8, alpha=16.0))
    optimizer: str = "sgd"
    compute_dtype: str = "float32"
    quant: str = "int4"
    group_size: int = 64
    fused_update: bool = True  # one micro-batch and no clipping: each block steps at once

    @classmethod
    def from_config(cls, arch: Architecture, config: TrainConfig) -> Workload:
        return cls(arch=arch, seq_len=config.seq_len, method=config.method,
                   batch_size=config.batch_size,
                   lora=LoraSpec(rank=config.lora_rank, alpha=config.lora_alpha,
                                 targets=config.lora_targets),
                   optimizer=config.optimizer, compute_dtype=config.compute_dtype,
                   quant=config.quant, group_size=config.group_size,
                   fused_update=config.method == "mebp" and config.grad_accum_steps == 1
                   and config.max_grad_norm is None)

    def __post_init__(self) -> None:
        if self.seq_len > self.arch.max_positions:
            raise PlanInputError(f"seq_len {self.seq_len} exceeds the model's context of "
                                 f"{self.arch.max_positions} tokens (max_position_embeddings)")

    @property
    def tokens(self) -> int:
        return self.batch_size * self.seq_len


@lru_cache(maxsize=256)
def canonical_workload(workload: Workload) -> Workload:
    """The first instance equal to ``workload``: the planner's memos, keyed on workloads,
    then find theirs by identity rather than comparing every field."""
    return workload


def matmul_dtype_of(workload: Workload, knobs: EngineKnobs) -> str:
    """What the matmuls run in (and lazy tiles are decompressed to): float32 for bfloat16
    storage on a host without bf16 matmul instructions."""
    return matmul_dtype(workload.compute_dtype, knobs.bf16_matmul)


def matmul_bytes(workload: Workload, knobs: EngineKnobs) -> int:
    return DTYPE_BYTES[matmul_dtype_of(workload, knobs)]


def shares_decompression(workload: Workload, knobs: EngineKnobs) -> bool:
    """Whether the backward decompresses each block once (``share_decompression``, its
    ``auto`` resolved for this workload on this host)."""
    upcasts = matmul_dtype_of(workload, knobs) != workload.compute_dtype
    return knobs.shares_decompression(upcasts)


def tile_rows(rows: int, cols: int, tile_bytes: int, e: int) -> int:
    """Rows of a (rows, cols) weight per decompressed tile, as the engine sizes them."""
    return max(1, min(rows, tile_bytes // (cols * e)))


def vocab_tiles(arch: Architecture, tile_bytes: int, e: int) -> int:
    """The loss's vocabulary tiles per pass (the head's rows in tiles of ``tile_bytes``)."""
    return math.ceil(arch.vocab_size / tile_rows(arch.vocab_size, arch.hidden_size,
                                                 tile_bytes, e))


@lru_cache(maxsize=64)
def frozen_weight_suffixes(arch: Architecture) -> tuple[tuple[str, int, str | None], ...]:
    """``arch.frozen_weights()`` with each one's projection suffix (None: the head)."""
    return tuple((name, params, name.split(".")[-2] if "layers" in name else None)
                 for name, params in arch.frozen_weights())


def shape_of(arch: Architecture, name: str) -> tuple[int, int]:
    if "layers" not in name:
        return arch.vocab_size, arch.hidden_size
    return arch.projections()[name.split(".")[-2]]


def adapted_projections(workload: Workload) -> Mapping[str, tuple[int, int]]:
    return _adapted_projections(workload.arch, workload.lora.targets)


@lru_cache(maxsize=256)
def _adapted_projections(arch: Architecture, targets: tuple[str, ...]
                         ) -> Mapping[str, tuple[int, int]]:
    suffixes = {TARGET_SUFFIXES[short].split(".")[-1] for short in targets}
    return MappingProxyType({s: shape for s, shape in arch.projections().items()
                             if s in suffixes})


def lora_parameters_per_block(workload: Workload) -> int:
    return sum(workload.lora.rank * (inp + out) for out, inp in
               adapted_projections(workload).values())


def packed_bytes_per_param(workload: Workload) -> float:
    """Bytes of the packed store per frozen parameter: its bits, plus an fp16 scale and bias
    per quantization group."""
    bits = {"int4": 4, "int8": 8, "none": 16}[workload.quant]
    scales = 0 if workload.quant == "none" else 2 * 2 / workload.group_size
    return bits / 8 + scales


MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def mlp_chunk_tokens(workload: Workload, knobs: EngineKnobs) -> int:
    """Tokens per pass of a block's MLP: all of them unless ``mlp_chunk_tokens``."""
    chunk = knobs.mlp_chunk_tokens
    if chunk is None or knobs.checkpoint_blocks == "none":
        return workload.tokens
    return min(chunk, workload.tokens)


def graph_tail_blocks(workload: Workload, knobs: EngineKnobs) -> int:
    """Blocks the step runs in one autograd graph after the checkpointed ones (none without
    checkpoints, where every block is in the graph, and for MeZO, which keeps no graph)."""
    if workload.method == "mezo" or knobs.checkpoint_blocks == "none":
        return 0
    return min(knobs.graph_tail_blocks, workload.arch.num_layers)


def mlp_chunks(workload: Workload, knobs: EngineKnobs) -> int:
    """Token chunks of a block's MLP: each decompresses (or upcasts) its tiles again."""
    return math.ceil(workload.tokens / mlp_chunk_tokens(workload, knobs))


def mlp_intermediate_width(workload: Workload, knobs: EngineKnobs) -> int:
    """Intermediate columns per pass of a block's MLP, over every token: all of them unless
    ``mlp_intermediate_chunk``."""
    width = knobs.mlp_intermediate_chunk
    if width is None or knobs.checkpoint_blocks == "none":
        return workload.arch.intermediate_size
    return min(width, workload.arch.intermediate_size)


def mlp_output_passes(arch: Architecture, width: int) -> int:
    """Extra passes of gate and up per block backward in intermediate-column chunks of
    ``width``: a block that norms its MLP's output before the sum (Gemma 3) makes that
    output first (its chunks' recomputes then skip down's product, as every block's do)."""
    if arch.residual_output_projection is None and width < arch.intermediate_size:
        return 1
    return 0


def mlp_column_chunks(workload: Workload, knobs: EngineKnobs) -> int:
    """Intermediate-column chunks of a block's MLP: each runs the MLP's ops again, but
    decompresses only its own columns of each weight."""
    return math.ceil(workload.arch.intermediate_size / mlp_intermediate_width(workload, knobs))


# (tokens, intermediate) tensors a block's MLP graph keeps: gate, up, the activation and the
# product; in a chained graph gate and up alone (the engine recomputes the other two there)
MLP_SAVED_WIDE = 4
CHAINED_MLP_SAVED_WIDE = 2


def saved_bytes_per_token(workload: Workload, knobs: EngineKnobs) -> float:
    """Bytes one block's autograd graph keeps per token, recomputed alone, as counted with
    ``torch.autograd.graph.saved_tensors_hooks`` on the engine's blocks (qwen2.5, qwen3,
    gemma3, llama/smollm2; within 2-10%): gate, up, activation and product; q, k, v in the
    attention layout, their rotated copies (and normed ones, with a q/k norm) and the
    attention output; the block's residual inputs; each RMSNorm's float32 statistics-sized
    copies (a bound: a 16-bit input is kept in its copy's place, ``models.base.
    upcast_kept_as_input``)."""
    return sum(saved_bytes_per_token_by_part(workload, knobs).values())


def saved_bytes_per_token_by_part(workload: Workload, knobs: EngineKnobs,
                                  mlp_width: int | None = None, *, chained: bool = False
                                  ) -> Mapping[str, float]:
    """``saved_bytes_per_token`` split into the block's attention part and its MLP part; the
    MLP's for ``mlp_width`` of its intermediate columns (all by default); ``chained``: a
    block in one graph with others, whose MLP keeps fewer (``engine.gated_mlp``)."""
    wide = CHAINED_MLP_SAVED_WIDE if chained else MLP_SAVED_WIDE
    return _saved_bytes_per_token_by_part(workload, knobs.lora_hidden,
                                          mlp_width or workload.arch.intermediate_size, wide)


@lru_cache(maxsize=256)
def _saved_bytes_per_token_by_part(workload: Workload, lora_hidden: str, i: int, wide: int
                                   ) -> Mapping[str, float]:
    arch, e = workload.arch, DTYPE_BYTES[workload.compute_dtype]
    d = arch.hidden_size
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    gemma = arch.model_type == "gemma3_text"
    norms = 2 if gemma else 1  # per part: Gemma 3 normalizes before and after each
    kv_copies = 5 if gemma else 3
    qk_normed = q + kv if arch.qk_norm else 0  # q and k kept before and after their norm
    # each norm at its float32 copy's size, though it keeps its (16-bit) input instead: at
    # the input's size the planner picked a graph tail of two blocks for 320 MB, which ran
    # 6-9% above that count and was OOM-killed once under the cap (BENCHMARKS, "The
    # dequantization kernel on explicit vectors ..."); the copy's size keeps it unpicked
    parts = {"attention": e * (3 * q + kv_copies * kv + d + qk_normed) + 4 * 1.2 * d * norms,
             "mlp": e * (wide * i + d) + 4 * 1.2 * d * norms}
    if lora_hidden == "store":
        for suffix in adapted_projections(workload):
            parts["mlp" if suffix in MLP_PROJECTIONS else "attention"] += e * workload.lora.rank
    return MappingProxyType(parts)
