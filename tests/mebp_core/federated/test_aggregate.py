"""FedAvg averages A and B by examples; FFA trains B alone from a shared A, so its average is
the average of the devices' updates, exactly."""

from __future__ import annotations

import json

import pytest
import torch

from mebp_core.config import TrainConfig
from mebp_core.engine.memory import track_memory
from mebp_core.engine.train import train
from mebp_core.federated.aggregate import AggregationError, Update, aggregate
from mebp_core.lora.peft_io import load_peft_adapter
from mebp_core.store.resolve import resolve_model


def adapters(seed: int, paths=("q", "v"), rank: int = 2) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {path: (torch.randn(rank, 6, generator=generator),
                   torch.randn(5, rank, generator=generator)) for path in paths}


def test_fedavg_weights_each_device_by_its_examples():
    first, second = adapters(0), adapters(1)
    combined = aggregate([Update("a", first, 30), Update("b", second, 10)], "fedavg")
    for path in first:
        for i in (0, 1):
            expected = 0.75 * first[path][i] + 0.25 * second[path][i]
            torch.testing.assert_close(combined[path][i], expected, rtol=0, atol=1e-6)


def test_an_average_does_not_depend_on_the_order_of_devices():
    updates = [Update(str(i), adapters(i), 1 + i) for i in range(5)]
    forward = aggregate(updates, "fedavg")
    backward = aggregate(updates[::-1], "fedavg")
    assert all(torch.equal(forward[p][i], backward[p][i]) for p in forward for i in (0, 1))


def test_adapters_that_cannot_be_combined_are_refused():
    with pytest.raises(AggregationError, match="adapts other modules"):
        aggregate([Update("a", adapters(0), 1), Update("b", adapters(1, ("q",)), 1)], "fedavg")
    with pytest.raises(AggregationError, match="b: q has another shape"):
        aggregate([Update("a", adapters(0), 1), Update("b", adapters(1, rank=3), 1)],
                  "fedavg")
    with pytest.raises(AggregationError, match="A differs"):
        aggregate([Update("a", adapters(0), 1), Update("b", adapters(1), 1)], "ffa")
    with pytest.raises(AggregationError, match="no device finished"):
        aggregate([], "fedavg")


def local_training(tmp_path, name: str, text: str, config: TrainConfig):
    data = tmp_path / f"{name}.jsonl"
    data.write_text("".join(json.dumps({"text": f"{text} {i}"}) + "\n" for i in range(8)))
    with track_memory() as memory:
        train(config, model_dir=resolve_model("preset:tiny"), data=data,
              out=tmp_path / name, memory=memory)
    return load_peft_adapter(tmp_path / name)[1]


def test_ffa_devices_share_a_and_their_average_is_the_average_update(tmp_path):
    config = TrainConfig(steps=3, seq_len=32, lr=0.5, lora_freeze_a=True, seed=7)
    first = local_training(tmp_path, "first", "the cat sat on the mat", config)
    second = local_training(tmp_path, "second", "colorless green ideas sleep", config)
    initial = local_training(tmp_path, "initial", "x", config.model_copy(update={"lr": 1e-9}))
    for path in first:
        assert torch.equal(first[path][0], second[path][0])  # A never moved
        assert torch.equal(first[path][0], initial[path][0])
        assert not torch.equal(first[path][1], second[path][1])  # B learned each its data
    combined = aggregate([Update("first", first, 8), Update("second", second, 24)], "ffa")
    for path, (lora_a, lora_b) in combined.items():
        expected = 0.25 * (first[path][1] @ first[path][0]) \
            + 0.75 * (second[path][1] @ second[path][0])
        torch.testing.assert_close(lora_b @ lora_a, expected, rtol=1e-5, atol=1e-7)
