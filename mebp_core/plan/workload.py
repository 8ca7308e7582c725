"""The workload the planner predicts: a model and a training setting, and what follows from
them alone (adapted projections, the bytes one block's autograd graph saves per token)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mebp_core.config import EngineKnobs, TrainConfig
from mebp_core.lora.spec import LoraSpec
from mebp_core.plan.arch import Architecture

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
MB = 1 << 20


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


def block_of(name: str) -> int:
    parts = name.split(".")
    return int(parts[parts.index("layers") + 1])


def shape_of(arch: Architecture, name: str) -> tuple[int, int]:
    if "layers" not in name:
        return arch.vocab_size, arch.hidden_size
    return arch.projections()[name.split(".")[-2]]


def adapted_projections(workload: Workload) -> dict[str, tuple[int, int]]:
    suffixes = {suffix.split(".")[-1] for suffix in workload.lora.module_suffixes()}
    return {s: shape for s, shape in workload.arch.projections().items() if s in suffixes}


def saved_bytes_per_token(workload: Workload, knobs: EngineKnobs) -> float:
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
        per_token += e * workload.lora.rank * len(adapted_projections(workload))
    return per_token
