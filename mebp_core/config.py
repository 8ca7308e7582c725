"""The one typed training configuration that flows from the edge (CLI, API) to the engine."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from mebp_core.lora.spec import TARGET_SUFFIXES, LoraSpec
from mebp_core.store.groups import MAX_GROUP_SIZE, MIN_GROUP_SIZE, check_group_size

SCHEMA_VERSION = 1
MAX_THREADS = 256
MAX_STEPS = 1_000_000

Method = Literal["mebp", "mezo", "backprop"]
Quant = Literal["none", "int8", "int4"]
ComputeDtype = Literal["float32", "bfloat16"]
Optimizer = Literal["sgd", "adamw"]
CheckpointStorage = Literal["ram", "mmap"]
StoreReads = Literal["mapped", "direct"]
FrozenWeights = Literal["lazy", "resident"]
LoraHidden = Literal["recompute", "store"]
Bf16Matmul = Literal["auto", "native", "float32"]
Schedule = Literal["constant", "cosine"]


# weights per quantization group (the store's rule, mebp_core/store/groups.py)
GroupSize = Annotated[int, Field(ge=MIN_GROUP_SIZE, le=MAX_GROUP_SIZE),
                      AfterValidator(check_group_size)]


class EngineKnobs(BaseModel):
    """The memory/time trade-off knobs the engine honors (each a no-op at its default)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    frozen_weights: FrozenWeights = Field(default="lazy", description=(
        "decompress frozen weights from the store on every use (lazy), or once and keep "
        "them in RAM (resident)"))
    resident_weight_bytes: int | None = Field(default=None, ge=0, description=(
        "with frozen_weights resident: keep at most this much (e.g. 300M), block "
        "projections first from block 0, then the output head (a resident byte saves two "
        "decompressions per step in a block and one in the head)"))
    checkpoint_blocks: Annotated[int, Field(ge=1)] | Literal["none"] = Field(
        default=1, description=(
            "save every K-th block input (1: every block; the backward re-runs each "
            "segment's forward from its checkpoint), or none: one autograd graph over the "
            "whole model, no block recomputed (each MLP's activation and product are, "
            "elementwise, in the backward)"))
    graph_tail_blocks: int = Field(default=0, ge=0, description=(
        "with checkpoints: run the model's last K blocks under one autograd graph, never "
        "recomputed but for each MLP's activation and product (the earlier blocks "
        "checkpointed as checkpoint_blocks says): memory for time, a block at a time; 0: "
        "every block checkpointed"))
    checkpoint_storage: CheckpointStorage = Field(default="ram", description=(
        "keep block-input checkpoints in RAM or in a memory-mapped file beside the output"))
    store_reads: StoreReads = Field(default="mapped", description=(
        "read the packed weights through a memory mapping (pages the kernel caches, and "
        "under a cap too small to keep them reads again every pass), or direct: O_DIRECT "
        "into two block-sized staging buffers, the next block read while one is used (no "
        "page cache; the buffers' memory counted; none once every weight is resident)"))
    lora_hidden: LoraHidden = Field(default="recompute", description=(
        "recompute LoRA's rank-r intermediate h = x A^T in backward (MeSP), or keep it"))
    # (measured on qwen2.5-0.5b seq 256 with upcast bf16: sharing held 25-30 MB more for no
    # speed, hence "auto")
    share_decompression: bool | Literal["auto"] = Field(default="auto", description=(
        "decompress each projection once per block in backward for its recompute and "
        "backward (faster; one block's weights live) instead of twice, tile by tile (less "
        "memory); auto shares unless bf16 matmuls are upcast to float32, where a tile "
        "decompressed straight to float32 costs what upcasting a held one does"))
    mlp_chunk_tokens: int | None = Field(default=None, ge=1, description=(
        "run each block's MLP this many tokens at a time in every pass (the attention still "
        "sees the whole sequence): no (tokens, intermediate) activation or gradient is "
        "larger than a chunk's, for one more decompression of the MLP's tiles per extra "
        "chunk in each pass that decompresses them; unset: the whole batch at once"))
    mlp_intermediate_chunk: int | None = Field(default=None, ge=64, multiple_of=64,
                                               description=(
        "run each block's MLP over every token this many columns of its intermediate "
        "dimension at a time (gate and up rows, down columns; down's output summed over "
        "them): no (tokens, intermediate) activation or gradient is wider than a chunk, and "
        "each MLP weight is still decompressed once per pass; unset: the whole width"))
    decompress_tile_bytes: int = Field(default=8 << 20, ge=1 << 16, description=(
        "rows a lazy projection decompresses at once"))
    loss_vocab_tile_bytes: int = Field(default=8 << 20, ge=1 << 16, description=(
        "output-head rows per loss chunk"))
    bf16_matmul: Bf16Matmul = Field(default="auto", description=(
        "with compute_dtype bfloat16: matmuls in bf16 (native) or in float32 on bf16 storage, "
        "upcast a bounded tile at a time (float32); auto: native only on CPUs with bf16 "
        "matmul instructions. Storage stays bf16 either way"))
    threads: int | None = Field(default=None, ge=1, le=MAX_THREADS, description=(
        "torch's intra-op threads (at most the host's cores are used)"))

    def shares_decompression(self, upcasts: bool) -> bool:
        """What ``share_decompression`` means for a run whose matmuls are (not) upcast."""
        if self.share_decompression == "auto":
            return not upcasts
        return self.share_decompression

    @model_validator(mode="after")
    def _budget_needs_resident(self) -> EngineKnobs:
        if self.resident_weight_bytes is not None and self.frozen_weights != "resident":
            raise ValueError("resident_weight_bytes needs frozen_weights 'resident'")
        if self.mlp_chunk_tokens is not None and self.checkpoint_blocks == "none":
            raise ValueError("mlp_chunk_tokens chunks the checkpointed backward; it needs "
                             "checkpoint_blocks other than 'none'")
        if self.graph_tail_blocks and self.checkpoint_blocks == "none":
            raise ValueError("graph_tail_blocks keeps the last blocks out of the "
                             "checkpoints; with checkpoint_blocks 'none' every block is in "
                             "the graph already (use 0)")
        if self.graph_tail_blocks and self.mlp_chunk_tokens is not None:
            raise ValueError("mlp_chunk_tokens bounds the recomputed blocks' (tokens, "
                             "intermediate) tensors, graph_tail_blocks keeps whole blocks' "
                             "activations: set one of them")
        if self.mlp_intermediate_chunk is not None:
            if self.checkpoint_blocks == "none" or self.graph_tail_blocks:
                raise ValueError("mlp_intermediate_chunk chunks the checkpointed blocks' "
                                 "MLP; it needs checkpoint_blocks other than 'none' and no "
                                 "graph_tail_blocks")
            if self.mlp_chunk_tokens is not None:
                raise ValueError("mlp_chunk_tokens and mlp_intermediate_chunk each bound the "
                                 "MLP's (tokens, intermediate) tensors: set one of them")
        return self


# Plain backprop is the one engine with these knobs: every frozen projection and the head
# decompressed once and kept, and one autograd graph over the whole model.
BACKPROP_KNOBS = {"frozen_weights": "resident", "resident_weight_bytes": None,
                  "checkpoint_blocks": "none", "graph_tail_blocks": 0,
                  "mlp_chunk_tokens": None, "mlp_intermediate_chunk": None}


class TrainConfig(BaseModel):
    """Everything that determines a training run; validated once at the edge."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    schema_version: int = SCHEMA_VERSION
    method: Method = Field(default="mebp", description=(
        "mebp (exact gradients, memory-efficient), mezo (zeroth-order, two forwards) or "
        "backprop (plain autograd, the baseline)"))
    steps: int = Field(default=10, ge=1, le=MAX_STEPS, description="optimizer steps")
    seq_len: int = Field(default=256, ge=2, le=131_072, description="tokens per sequence")
    batch_size: int = Field(default=1, ge=1, le=1024, description="sequences per step")
    lora_rank: int = Field(default=8, ge=1, le=1024, description="LoRA rank r")
    lora_alpha: float = Field(default=16.0, gt=0, le=65536, description=(
        "LoRA alpha: the update is scaled by alpha / r"))
    lora_targets: tuple[str, ...] = Field(default=tuple(TARGET_SUFFIXES), description=(
        "the projections LoRA adapts, comma-separated (q,k,v,o,gate,up,down)"))
    lora_freeze_a: bool = Field(default=False, description=(
        "train only B; A stays at its seeded init (FFA-LoRA: averaging B across devices that "
        "share the init averages their updates exactly)"))
    optimizer: Optimizer = Field(default="sgd", description="sgd or adamw")
    lr: float = Field(default=1e-4, gt=0, le=10.0, description="learning rate")
    weight_decay: float = Field(default=0.0, ge=0, le=10.0, description="weight decay")
    seed: int = Field(default=0, ge=0, le=2**63 - 1,
                      description="seeds the adapter's init, the data order, MeZO")
    quant: Quant = Field(default="int4", description="how the frozen weights are stored")
    schedule: Schedule = Field(default="constant", description="learning-rate schedule")
    warmup_steps: int = Field(default=0, ge=0, description="linear warm-up steps")
    grad_accum_steps: int = Field(default=1, ge=1, le=1024, description=(
        "batches whose gradients are summed per optimizer step"))
    max_grad_norm: float | None = Field(default=None, gt=0, description=(
        "clip the global gradient norm to this"))
    mezo_eps: float = Field(default=1e-3, gt=0, le=1.0, description=(
        "MeZO's perturbation scale"))
    group_size: GroupSize = Field(default=64, description=(
        "weights per quantization group (a power of two)"))
    compute_dtype: ComputeDtype = Field(default="float32", description=(
        "activations, checkpoints and decompressed weights in float32 or bfloat16"))
    eval_every: int | None = Field(default=None, ge=1, description=(
        "validate every N steps (and at the end)"))
    validation_fraction: float | None = Field(default=None, gt=0, lt=1, description=(
        "hold out this fraction of the training data for validation"))
    checkpoint_every: int | None = Field(default=None, ge=1, description=(
        "save a resumable checkpoint every N steps"))
    skip_malformed: bool = Field(default=False, description=(
        "skip and count malformed JSONL lines instead of failing"))
    validation_rows: int | None = Field(default=None, ge=1, le=1_000_000, description=(
        "score at most this many validation rows, a sample drawn with the seed (unset: "
        "all of them)"))
    data_start_batch: int = Field(default=0, ge=0, le=MAX_STEPS * 1024, description=(
        "start at this micro-batch of the data's stream (epochs laid end to end, each "
        "reshuffled with the seed): a federated device's cursor, the batches its earlier "
        "rounds drew"))
    knobs: EngineKnobs = EngineKnobs()

    @model_validator(mode="before")
    @classmethod
    def _backprop_is_knob_settings(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("method") == "backprop":
            knobs = data.get("knobs") or {}
            if isinstance(knobs, EngineKnobs):
                knobs = knobs.model_dump()
            data = {**data, "knobs": {**knobs, **BACKPROP_KNOBS}}
        return data

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, value: int) -> int:
        if value != SCHEMA_VERSION:
            raise ValueError(f"a config of schema version {value}; this version reads and "
                             f"writes version {SCHEMA_VERSION}")
        return value

    @model_validator(mode="after")
    def _mezo_is_plain_sgd(self) -> TrainConfig:
        if self.method != "mezo":
            return self
        if self.optimizer != "sgd":
            # AdamW state is as large as the parameters: it would defeat MeZO's point.
            raise ValueError("method mezo trains with sgd only (MeZO-SGD); use --optimizer sgd")
        if self.grad_accum_steps != 1 or self.max_grad_norm is not None:
            raise ValueError("method mezo takes one batch per step and no gradient clipping "
                             "(--grad-accum-steps 1, no --max-grad-norm)")
        return self

    def resume_key(self) -> dict:
        """The fields a resumed run must share with the run that wrote the checkpoint."""
        return self.model_dump(mode="json", exclude={"steps", "knobs", "eval_every",
                                                     "checkpoint_every"})

    @field_validator("lora_targets", mode="before")
    @classmethod
    def _normalize_targets(cls, value: object) -> tuple[str, ...]:
        try:
            return LoraSpec(targets=value).targets
        except ValidationError as exc:  # re-raised so the error names lora_targets alone
            raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
