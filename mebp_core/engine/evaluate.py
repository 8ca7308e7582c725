"""Loss and next-token accuracy of a model (and adapter) on a dataset, without gradients."""

from __future__ import annotations

from pathlib import Path

import torch

from mebp_core.data.example import IGNORE_INDEX, Example
from mebp_core.data.batching import pack_examples
from mebp_core.data.jsonl import read_examples
from mebp_core.data.tokenizer import load_tokenizer
from mebp_core.engine.mebp import evaluate_batch
from mebp_core.engine.model import load_engine_model


def collate(examples: list[Example], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad a list of examples into (B, T) input_ids and labels."""
    width = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    for row, example in enumerate(examples):
        input_ids[row, : len(example.input_ids)] = torch.tensor(example.input_ids)
        labels[row, : len(example.labels)] = torch.tensor(example.labels)
    return input_ids, labels


def evaluate_dataset(model_dir: Path, data: Path, *, adapter: Path | None = None,
                     compute_dtype: str = "float32", seq_len: int = 256,
                     batch_size: int = 1) -> dict:
    """Mean token loss, next-token accuracy and the number of scored tokens over ``data``."""
    engine = load_engine_model(model_dir, compute_dtype=compute_dtype, init_adapter=adapter)
    try:
        tokenizer = load_tokenizer(model_dir, engine.config)
        report = read_examples(data, tokenizer, seq_len=seq_len,
                               vocab_size=engine.arch.args.vocab_size)
        examples = pack_examples(report.examples, seq_len)
        loss_sum, tokens, correct = 0.0, 0, 0
        for start in range(0, len(examples), batch_size):
            input_ids, labels = collate(examples[start : start + batch_size],
                                        tokenizer.pad_token_id)
            result = evaluate_batch(engine, input_ids, labels)
            loss_sum += result.loss_sum
            tokens += result.valid_tokens
            correct += result.correct_tokens
    finally:
        engine.close()
    return {"loss": loss_sum / max(tokens, 1), "token_accuracy": correct / max(tokens, 1),
            "tokens": tokens}
