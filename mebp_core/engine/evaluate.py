"""Loss and next-token accuracy of a model (and adapter) on a dataset, without gradients."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mebp_core.data.batching import iter_eval_batches, pack_examples
from mebp_core.data.example import Example
from mebp_core.data.jsonl import read_examples
from mebp_core.data.tokenizer import load_tokenizer
from mebp_core.engine.mebp import evaluate_batch
from mebp_core.engine.model import EngineModel, load_engine_model


def evaluate_examples(engine: EngineModel, examples: Sequence[Example], *, batch_size: int,
                      pad_token_id: int) -> dict:
    """Mean token loss, next-token accuracy and the number of scored tokens."""
    loss_sum, tokens, correct = 0.0, 0, 0
    for batch in iter_eval_batches(examples, batch_size=batch_size, pad_token_id=pad_token_id):
        result = evaluate_batch(engine, batch.input_ids, batch.labels)
        loss_sum += result.loss_sum
        tokens += result.valid_tokens
        correct += result.correct_tokens
    return {"loss": loss_sum / max(tokens, 1), "token_accuracy": correct / max(tokens, 1),
            "tokens": tokens}


def evaluate_dataset(model_dir: Path, data: Path, *, adapter: Path | None = None,
                     compute_dtype: str = "float32", seq_len: int = 256,
                     batch_size: int = 1) -> dict:
    """``evaluate_examples`` over a JSONL file, loading the model (and adapter) first."""
    engine = load_engine_model(model_dir, compute_dtype=compute_dtype, init_adapter=adapter)
    try:
        engine.check_seq_len(seq_len)
        tokenizer = load_tokenizer(model_dir, engine.config)
        report = read_examples(data, tokenizer, seq_len=seq_len,
                               vocab_size=engine.arch.args.vocab_size)
        return evaluate_examples(engine, pack_examples(report.examples, seq_len),
                                 batch_size=batch_size, pad_token_id=tokenizer.pad_token_id)
    finally:
        engine.close()
