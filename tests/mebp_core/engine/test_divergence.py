"""A run whose loss or adapter becomes non-finite fails with ``DivergedError`` and writes no
adapter."""

from __future__ import annotations

import json

import pytest

from mebp_core.config import TrainConfig
from mebp_core.engine.memory import track_memory
from mebp_core.engine.train import train
from mebp_core.errors import DivergedError


def run(packed, data, out, **overrides):
    config = TrainConfig(**{"steps": 3, "seq_len": 16, "lora_rank": 4, "quant": "none",
                            "lr": 0.05, **overrides})
    metrics = out.with_name(out.name + ".metrics.jsonl")
    train(config, model_dir=packed, data=data, out=out, memory=track_memory(),
          metrics_path=metrics)
    return metrics


@pytest.mark.parametrize("method", ["mebp", "mezo"])
def test_a_diverging_run_fails_and_writes_no_adapter(packed_models, token_data, tmp_path,
                                                     method):
    # the largest decay and rate a request may ask for: each step multiplies the weights
    # by about -99, so the loss overflows within a few dozen steps
    out = tmp_path / "adapter"
    with pytest.raises(DivergedError, match="diverged") as caught:
        run(packed_models["llama", "none"], token_data, out, method=method, steps=200, lr=10.0,
            weight_decay=10.0)
    assert caught.value.code == "training_diverged"
    assert not out.exists()
    lines = (tmp_path / "adapter.metrics.jsonl").read_text().splitlines()
    assert 0 < len(lines) < 200  # it stopped where it diverged, logging finite steps only
    assert all(json.loads(line)["loss"] < float("inf") for line in lines)


def test_non_finite_settings_are_refused():
    for field in ("lr", "weight_decay", "lora_alpha", "mezo_eps"):
        for value in (float("nan"), float("inf")):
            with pytest.raises(ValueError, match="finite"):
                TrainConfig(**{field: value})
