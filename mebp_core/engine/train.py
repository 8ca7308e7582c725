"""The training loop: data to batches, one MeBP step per batch, metrics, the adapter."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from mebp_core.config import TrainConfig
from mebp_core.data.batching import iter_batches, pack_examples
from mebp_core.data.jsonl import read_examples
from mebp_core.data.tokenizer import load_tokenizer
from mebp_core.engine.checkpoints import make_checkpoints
from mebp_core.engine.memory import MB, MemorySampler
from mebp_core.engine.methods import StepFunction, make_step_function
from mebp_core.engine.model import EngineModel, load_engine_model
from mebp_core.engine.optim import BlockOptimizer, make_optimizer
from mebp_core.lora.peft_io import save_peft_adapter
from mebp_core.lora.spec import LoraSpec


class TrainError(ValueError):
    """The run cannot start: a setting does not fit the model or the data."""


@dataclass
class StepMetrics:
    step: int
    loss: float
    tokens: int
    step_time_s: float
    decompress_s: float
    peak_anon_mb: float
    footprint_mb: float
    step_peak_anon_mb: float
    weights_live_peak_mb: float
    checkpoint_mb: float


@dataclass
class TrainResult:
    steps: int
    final_loss: float
    adapter_dir: Path
    peak_anon_mb: float
    footprint_mb: float


def lora_spec_of(config: TrainConfig) -> LoraSpec:
    return LoraSpec(rank=config.lora_rank, alpha=config.lora_alpha, targets=config.lora_targets)


def make_block_optimizers(engine: EngineModel, config: TrainConfig) -> list[BlockOptimizer]:
    """One optimizer per block, so each block is updated as soon as its gradients are done."""
    return [make_optimizer(config.optimizer, engine.block_parameters(index), lr=config.lr,
                           weight_decay=config.weight_decay)
            for index in range(len(engine.layers))]


def train(config: TrainConfig, *, model_dir: Path, data: Path, out: Path,
          sampler: MemorySampler, init_adapter: Path | None = None,
          metrics_path: Path | None = None, base_model_name: str | None = None,
          on_step: Callable[[StepMetrics], None] | None = None) -> TrainResult:
    """Fine-tune LoRA adapters on ``data`` and write the PEFT adapter to ``out``."""
    if config.knobs.threads:
        torch.set_num_threads(config.knobs.threads)
    engine = load_engine_model(model_dir, compute_dtype=config.compute_dtype,
                               lora_spec=lora_spec_of(config), seed=config.seed,
                               init_adapter=init_adapter, knobs=config.knobs)
    try:
        batches = _open_batches(engine, model_dir, data, config)
        optimizers = make_block_optimizers(engine, config)
        checkpoints = make_checkpoints(config.knobs.checkpoint_storage)
        run_step = make_step_function(engine, config, optimizers, checkpoints)
        metrics_file = metrics_path.open("w") if metrics_path else None
        last = None
        try:
            for step in range(1, config.steps + 1):
                input_ids, labels = next(batches)
                last = _train_step(engine, run_step, sampler, step, input_ids, labels)
                if metrics_file:
                    metrics_file.write(json.dumps(asdict(last)) + "\n")
                    metrics_file.flush()
                if on_step:
                    on_step(last)
        finally:
            checkpoints.close()
            if metrics_file:
                metrics_file.close()
        save_peft_adapter(out, engine.adapter_tensors(), engine.lora_spec,
                          base_model_name_or_path=base_model_name,
                          model_type=engine.config.get("model_type"))
    finally:
        engine.close()
    return TrainResult(config.steps, last.loss, out, sampler.peak_anon_bytes / MB,
                       sampler.footprint_bytes / MB)


def _train_step(engine: EngineModel, run_step: StepFunction, sampler: MemorySampler,
                step: int, input_ids: torch.Tensor, labels: torch.Tensor) -> StepMetrics:
    engine.working_set.reset_counters()
    start = time.perf_counter()
    result = run_step(step, input_ids, labels)
    elapsed = time.perf_counter() - start
    step_peak = sampler.take_step_peak()
    return StepMetrics(
        step=step, loss=result.loss_sum / max(result.valid_tokens, 1),
        tokens=result.valid_tokens, step_time_s=elapsed,
        decompress_s=engine.working_set.decompress_s,
        peak_anon_mb=sampler.peak_anon_bytes / MB, footprint_mb=sampler.footprint_bytes / MB,
        step_peak_anon_mb=step_peak / MB,
        weights_live_peak_mb=engine.working_set.peak_bytes / MB,
        checkpoint_mb=_checkpoint_bytes(engine, input_ids) / MB)


def _checkpoint_bytes(engine: EngineModel, input_ids: torch.Tensor) -> int:
    """What the block-input checkpoints hold during a step: L x (B, T, D) in the compute dtype."""
    elem = torch.empty((), dtype=engine.dtype).element_size()
    return len(engine.layers) * input_ids.numel() * engine.arch.args.hidden_size * elem


def _open_batches(engine: EngineModel, model_dir: Path, data: Path,
                  config: TrainConfig) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    args = engine.arch.args
    if config.seq_len > args.max_position_embeddings:
        raise TrainError(f"--seq-len {config.seq_len} exceeds the model's context of "
                         f"{args.max_position_embeddings} tokens (max_position_embeddings)")
    tokenizer = load_tokenizer(model_dir, engine.config)
    report = read_examples(data, tokenizer, seq_len=config.seq_len, vocab_size=args.vocab_size)
    examples = pack_examples(report.examples, config.seq_len)
    for batch in iter_batches(examples, batch_size=config.batch_size, seq_len=config.seq_len,
                              seed=config.seed, pad_token_id=tokenizer.pad_token_id):
        yield batch.input_ids, batch.labels
