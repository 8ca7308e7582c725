"""The training loop: batches, one optimizer step at a time, validation, checkpoints, metrics.

Deterministic for a seed: the data order, the LoRA init and MeZO's perturbations all derive
from it, so a run resumed from a checkpoint reproduces the uninterrupted run's loss curve.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from mebp_core.atomic import check_replaceable
from mebp_core.config import TrainConfig
from mebp_core.data.batching import (
    Batch,
    iter_batches,
    pack_examples,
    sample_examples,
    split_validation,
)
from mebp_core.data.example import Example
from mebp_core.data.jsonl import read_examples
from mebp_core.data.tokenizer import load_tokenizer
from mebp_core.engine.checkpoints import make_checkpoints
from mebp_core.engine.evaluate import evaluate_examples
from mebp_core.engine.kept_adapters import kept_adapter_dir
from mebp_core.engine.memory import MemoryTracker
from mebp_core.engine.methods import make_step_function
from mebp_core.engine.metrics_file import keep_steps_through
from mebp_core.engine.model import EngineModel, load_engine_model
from mebp_core.engine.optim import BlockOptimizer, make_optimizer
from mebp_core.engine.run_state import (
    CHECKPOINT_FILES,
    RunPosition,
    load_run_state,
    save_run_state,
)
from mebp_core.engine.schedule import compute_lr
from mebp_core.errors import DivergedError, MebpError
from mebp_core.lora.peft_io import ADAPTER_FILES
from mebp_core.lora.spec import LoraSpec
from mebp_core.units import MB


class TrainError(MebpError, ValueError):
    """The run cannot start: a setting does not fit the model or the data."""


@dataclass
class StepMetrics:
    step: int
    loss: float
    lr: float
    tokens: int
    step_time_s: float
    decompress_s: float
    peak_mb: float  # the run's peak of charged memory (anonymous + shared)
    peak_anon_mb: float  # anonymous alone, for comparison
    footprint_mb: float  # peak_mb above what the process held before loading
    step_peak_mb: float  # this step's charged peak
    file_mb: float  # the peak of clean file-backed pages (the mapped store): reclaimable
    weights_live_peak_mb: float
    checkpoint_mb: float
    # the job cgroup's peak of usage so far, reclaimable store pages included (counters only)
    cgroup_usage_peak_mb: float | None = None
    val_loss: float | None = None
    val_token_accuracy: float | None = None
    # the packed training examples (positions in the data) this step trained on, when at
    # most RECORDED_EXAMPLES (a line per step stays small)
    examples: list[int] | None = None

    def to_json(self) -> str:
        """Strict JSON: a non-finite figure (a diverged validation loss) is left out."""
        return json.dumps({k: v for k, v in asdict(self).items()
                           if v is not None and (not isinstance(v, float) or math.isfinite(v))},
                          allow_nan=False)


RECORDED_EXAMPLES = 1024


def _recorded(examples: list[int]) -> list[int] | None:
    return examples if len(examples) <= RECORDED_EXAMPLES else None


@dataclass
class TrainResult:
    steps: int  # optimizer steps completed, resumed ones included
    final_loss: float | None
    adapter_dir: Path
    peak_mb: float
    peak_anon_mb: float
    footprint_mb: float
    memory_method: str  # where the memory figures come from (cgroup counters or sampling)
    interrupted: bool = False
    checkpoint_dir: Path | None = None
    skipped_rows: int = 0  # malformed JSONL lines skipped with skip_malformed


@dataclass
class TrainData:
    train: list[Example]
    validation: list[Example] | None
    pad_token_id: int
    skipped_rows: int


def lora_spec_of(config: TrainConfig) -> LoraSpec:
    return LoraSpec(rank=config.lora_rank, alpha=config.lora_alpha, targets=config.lora_targets)


def make_block_optimizers(engine: EngineModel, config: TrainConfig) -> list[BlockOptimizer]:
    """One optimizer per block, so each block can be updated as soon as its gradients are done."""
    return [make_optimizer(config.optimizer, engine.block_parameters(index), lr=config.lr,
                           weight_decay=config.weight_decay)
            for index in range(len(engine.layers))]


def load_train_data(engine: EngineModel, model_dir: Path, data: Path,
                    validation_data: Path | None, config: TrainConfig) -> TrainData:
    args = engine.arch.args
    engine.check_seq_len(config.seq_len)
    tokenizer = load_tokenizer(model_dir, engine.config)

    def read(path: Path):
        return read_examples(path, tokenizer, seq_len=config.seq_len,
                             vocab_size=args.vocab_size, skip_malformed=config.skip_malformed)

    report = read(data)
    train_rows, validation = report.examples, None
    skipped = len(report.skipped)
    if validation_data is not None:
        validation_report = read(validation_data)
        validation, skipped = validation_report.examples, skipped + len(validation_report.skipped)
    elif config.validation_fraction is not None:
        if len(train_rows) < 2:
            raise TrainError(f"{data}: --validation-fraction needs at least 2 rows to hold "
                             f"some out, the dataset has {len(train_rows)}")
        train_rows, validation = split_validation(train_rows, config.validation_fraction,
                                                  config.seed)
    if validation is not None and config.validation_rows is not None:
        validation = sample_examples(validation, config.validation_rows, config.seed)
    if validation is not None:
        validation = pack_examples(validation, config.seq_len)
    return TrainData(pack_examples(train_rows, config.seq_len), validation,
                     tokenizer.pad_token_id, skipped)


def train(config: TrainConfig, *, model_dir: Path, data: Path, out: Path,
          memory: MemoryTracker, init_adapter: Path | None = None,
          validation_data: Path | None = None, metrics_path: Path | None = None,
          checkpoint_dir: Path | None = None, resume: bool = False,
          kept_dir: Path | None = None,
          on_step: Callable[[StepMetrics], None] | None = None,
          stop_requested: Callable[[], bool] | None = None) -> TrainResult:
    """Fine-tune LoRA adapters on ``data`` and write the PEFT adapter to ``out``.

    ``stop_requested`` is polled between steps (signals, cancellation): the run then saves a
    checkpoint and the adapter trained so far, and returns with ``interrupted`` set.
    ``kept_dir``: where the adapter of every ``checkpoint_every`` step is kept, a folder per
    step (``mebp_core.engine.kept_adapters``).
    """
    if config.knobs.threads:
        torch.set_num_threads(min(config.knobs.threads, os.cpu_count() or 1))
    if resume and checkpoint_dir is None:
        raise TrainError("--resume needs the checkpoint directory of the interrupted run")
    check_replaceable(out, ADAPTER_FILES)  # before hours of training, not after
    if checkpoint_dir is not None:
        check_replaceable(checkpoint_dir, CHECKPOINT_FILES)
    engine = load_engine_model(model_dir, compute_dtype=config.compute_dtype,
                               lora_spec=lora_spec_of(config), seed=config.seed,
                               init_adapter=init_adapter, knobs=config.knobs,
                               freeze_lora_a=config.lora_freeze_a)
    try:
        run = TrainingRun(engine, config, load_train_data(engine, model_dir, data,
                                                          validation_data, config),
                          memory=memory, checkpoint_dir=checkpoint_dir,
                          scratch_dir=Path(out).absolute().parent, kept_dir=kept_dir)
        if resume:
            run.resume()
            if metrics_path is not None:
                keep_steps_through(metrics_path, run.position.step)
        log_file = open(metrics_path, "a" if resume else "w") if metrics_path else nullcontext()
        with log_file as log:
            run.loop(log, on_step, stop_requested or (lambda: False))
        check_finite_adapter(engine, run.position.step)
        engine.save_adapter(out)
    finally:
        engine.close()
    memory.take_step_peak()  # what saving the adapter after the last step held counts too
    return TrainResult(run.position.step, run.last_loss, out, memory.peak_bytes / MB,
                       memory.peak_anon_bytes / MB, memory.footprint_bytes / MB,
                       memory.method, run.interrupted, run.saved_checkpoint, run.data.skipped_rows)


def check_finite_adapter(engine: EngineModel, step: int) -> None:
    """Refuse to write an adapter a device would load as garbage."""
    for path, (a, b) in engine.adapter_tensors().items():
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise DivergedError(f"after step {step}: the LoRA weights of {path} are not "
                                f"finite (training diverged; lower the learning rate or "
                                f"weight decay); no adapter is written")


class TrainingRun:
    """The mutable state of one run: position in the data, optimizers, last results."""

    def __init__(self, engine: EngineModel, config: TrainConfig, data: TrainData, *,
                 memory: MemoryTracker, checkpoint_dir: Path | None,
                 scratch_dir: Path, kept_dir: Path | None = None) -> None:
        """``scratch_dir``: where memory-mapped block checkpoints go (on disk, beside the
        run's output, not a temp dir that may be tmpfs, i.e. shared memory)."""
        self.engine, self.config, self.data, self.memory = engine, config, data, memory
        self.checkpoint_dir, self.kept_dir = checkpoint_dir, kept_dir
        self.optimizers = make_block_optimizers(engine, config)
        self.checkpoints = make_checkpoints(config.knobs.checkpoint_storage, scratch_dir)
        self.run_step = make_step_function(engine, config, self.optimizers, self.checkpoints)
        self.position = RunPosition(0, config.data_start_batch)
        self.last_loss: float | None = None
        self.interrupted = False
        self.saved_checkpoint: Path | None = None

    def resume(self) -> None:
        self.position = load_run_state(self.checkpoint_dir, self.engine, self.optimizers,
                                       self.config)

    def loop(self, log, on_step, stop_requested: Callable[[], bool]) -> None:
        batches = self._batches()
        try:
            for step in range(self.position.step + 1, self.config.steps + 1):
                metrics = self._step(step, batches)
                if log is not None:
                    log.write(metrics.to_json() + "\n")
                    log.flush()
                if on_step is not None:
                    on_step(metrics)
                if self._due(self.config.checkpoint_every, step):
                    # the adapter first: killed between the two, the run resumes from the
                    # checkpoint before and trains this step again, keeping it then; the
                    # last step's is the run's own adapter (``out``), not kept twice
                    if step < self.config.steps:
                        self.keep_adapter(step)
                    self.save_checkpoint()
                if stop_requested() and step < self.config.steps:
                    self.interrupted = True
                    if self.checkpoint_dir is not None:
                        self.save_checkpoint()
                    break
        finally:
            self.checkpoints.close()

    def save_checkpoint(self) -> None:
        if self.checkpoint_dir is not None:
            self.saved_checkpoint = save_run_state(self.checkpoint_dir, self.engine,
                                                   self.optimizers, self.position, self.config)

    def keep_adapter(self, step: int) -> None:
        if self.kept_dir is None:
            return
        check_finite_adapter(self.engine, step)
        self.engine.save_adapter(kept_adapter_dir(self.kept_dir, step))

    def _batches(self) -> Iterator[Batch]:
        return iter_batches(self.data.train, batch_size=self.config.batch_size,
                            seq_len=self.config.seq_len, seed=self.config.seed,
                            pad_token_id=self.data.pad_token_id,
                            start=self.position.batches_consumed)

    def _step(self, step: int, batches: Iterator[Batch]) -> StepMetrics:
        drawn = [next(batches) for _ in range(self.config.grad_accum_steps)]
        micro_batches = [(batch.input_ids, batch.labels) for batch in drawn]
        lr = compute_lr(self.config, step)
        working_set = self.engine.working_set
        working_set.reset_counters()
        self.checkpoints.reset_peak()
        start = time.perf_counter()
        result = self.run_step(step, micro_batches, lr)
        elapsed = time.perf_counter() - start
        self.position = RunPosition(step, self.position.batches_consumed + len(micro_batches))
        self.last_loss = result.loss_sum / max(result.valid_tokens, 1)
        if not math.isfinite(self.last_loss):
            raise DivergedError(f"step {step}: the loss is {self.last_loss} (training "
                                f"diverged; lower the learning rate or weight decay)")
        metrics = StepMetrics(
            step=step, loss=self.last_loss, lr=lr, tokens=result.valid_tokens,
            step_time_s=elapsed, decompress_s=working_set.decompress_s,
            step_peak_mb=self.memory.take_step_peak() / MB,
            peak_mb=self.memory.peak_bytes / MB,
            peak_anon_mb=self.memory.peak_anon_bytes / MB,
            footprint_mb=self.memory.footprint_bytes / MB,
            file_mb=self.memory.peak_file_bytes / MB,
            weights_live_peak_mb=working_set.peak_bytes / MB,
            checkpoint_mb=self.checkpoints.peak_nbytes / MB,
            cgroup_usage_peak_mb=(None if self.memory.usage_peak_bytes is None
                                  else self.memory.usage_peak_bytes / MB),
            examples=_recorded([index for batch in drawn for index in batch.example_indices]))
        if self.data.validation and (self._due(self.config.eval_every, step)
                                     or step == self.config.steps):
            scores = evaluate_examples(self.engine, self.data.validation,
                                       batch_size=self.config.batch_size,
                                       pad_token_id=self.data.pad_token_id)
            metrics.val_loss, metrics.val_token_accuracy = (scores["loss"],
                                                            scores["token_accuracy"])
        return metrics

    @staticmethod
    def _due(every: int | None, step: int) -> bool:
        return every is not None and step % every == 0
