"""The training loop: schedules, accumulation, clipping, validation, exact resumption."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from mebp_core.config import EngineKnobs, TrainConfig
from mebp_core.engine.kept_adapters import kept_adapter_dir, kept_steps
from mebp_core.engine.memory import track_memory
from mebp_core.engine.run_state import ResumeError
from mebp_core.engine.schedule import compute_lr
from mebp_core.engine.train import train


@pytest.fixture(scope="module")
def token_data(tmp_path_factory):
    gen = torch.Generator().manual_seed(0)
    path = tmp_path_factory.mktemp("data") / "tokens.jsonl"
    rows = [{"input_ids": torch.randint(0, 300, (int(n),), generator=gen).tolist()}
            for n in torch.randint(12, 30, (6,), generator=gen)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def run(packed, data, out, *, stop_after=None, resume=False, kept_dir=None, **overrides):
    settings = dict(steps=4, seq_len=32, batch_size=1, lr=0.05, lora_rank=4, quant="none",
                    compute_dtype="float32")
    config = TrainConfig(**{**settings, **overrides})
    metrics = out.with_name(out.name + ".metrics.jsonl")
    seen = []
    result = train(config, model_dir=packed, data=data, out=out, memory=track_memory(),
                   metrics_path=metrics, checkpoint_dir=out.with_name(out.name + ".ckpt"),
                   resume=resume, kept_dir=kept_dir, on_step=seen.append,
                   stop_requested=lambda: stop_after is not None and len(seen) >= stop_after)
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    return load_file(out / "adapter_model.safetensors"), result, lines


def assert_same_adapter(first, second, rtol=1e-5):
    assert first.keys() == second.keys()
    for key in first:
        torch.testing.assert_close(first[key], second[key], rtol=rtol, atol=1e-7)


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_schedules_match_transformers(schedule):
    config = TrainConfig(lr=0.1, steps=20, warmup_steps=5, schedule=schedule)
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    reference = transformers.get_scheduler(
        "constant_with_warmup" if schedule == "constant" else "cosine", optimizer,
        num_warmup_steps=5, num_training_steps=20)
    for step in range(1, 21):
        assert compute_lr(config, step) == pytest.approx(optimizer.param_groups[0]["lr"])
        optimizer.step()
        reference.step()


def test_accumulating_two_batches_of_one_equals_one_batch_of_two(packed_models, token_data,
                                                                 tmp_path):
    packed = packed_models["llama", "none"]
    accumulated, _, _ = run(packed, token_data, tmp_path / "a", grad_accum_steps=2)
    batched, _, _ = run(packed, token_data, tmp_path / "b", batch_size=2)
    assert_same_adapter(accumulated, batched)


def test_clipping_bounds_the_update(packed_models, token_data, tmp_path):
    packed = packed_models["llama", "none"]
    before, _, _ = run(packed, token_data, tmp_path / "zero", steps=1, lr=1e-30)
    clipped, _, _ = run(packed, token_data, tmp_path / "clip", steps=1, lr=1.0,
                        max_grad_norm=1e-3)
    update = torch.cat([(clipped[k] - before[k]).flatten() for k in before])
    assert float(update.norm()) == pytest.approx(1e-3, rel=1e-3)


def test_mebp_and_backprop_agree_with_accumulation_and_clipping(packed_models, token_data,
                                                                tmp_path):
    packed = packed_models["gemma3_text", "none"]
    options = dict(grad_accum_steps=2, max_grad_norm=0.5, optimizer="adamw", lr=0.01)
    mebp, _, _ = run(packed, token_data, tmp_path / "mebp", **options)
    reference, _, _ = run(packed, token_data, tmp_path / "backprop", method="backprop",
                          **options)
    assert_same_adapter(mebp, reference, rtol=1e-3)


def test_validation_runs_every_n_steps_and_at_the_end(packed_models, token_data, tmp_path):
    _, _, lines = run(packed_models["qwen2", "none"], token_data, tmp_path / "v", steps=5,
                      eval_every=2, validation_fraction=0.34)
    validated = [line["step"] for line in lines if "val_loss" in line]
    assert validated == [2, 4, 5]
    assert all(0 <= line["val_token_accuracy"] <= 1 for line in lines if "val_loss" in line)


def test_a_run_started_at_a_batch_continues_the_data_stream(packed_models, token_data,
                                                            tmp_path):
    """Two runs, the second starting where the first stopped (``data_start_batch``), train
    the examples one run of both their steps trains, in its order (a fleet's device across
    rounds): each step records the examples it trained, every one once an epoch."""
    packed = packed_models["qwen3", "none"]
    _, _, whole = run(packed, token_data, tmp_path / "whole", steps=10, grad_accum_steps=2)
    _, _, first = run(packed, token_data, tmp_path / "first", steps=4, grad_accum_steps=2)
    _, _, second = run(packed, token_data, tmp_path / "second", steps=6, grad_accum_steps=2,
                       data_start_batch=8)
    walked = [index for line in first + second for index in line["examples"]]
    assert walked == [index for line in whole for index in line["examples"]]
    examples = len(token_data.read_text().splitlines())  # each row one packed example here
    assert sorted(walked[:examples]) == list(range(examples)) != walked[:examples]


def test_validation_rows_scores_a_sample(packed_models, token_data, tmp_path):
    _, _, every = run(packed_models["qwen2", "none"], token_data, tmp_path / "all", steps=1,
                      validation_fraction=0.5)
    _, _, sampled = run(packed_models["qwen2", "none"], token_data, tmp_path / "one", steps=1,
                        validation_fraction=0.5, validation_rows=1)
    assert every[-1]["val_loss"] != sampled[-1]["val_loss"]


@pytest.mark.parametrize(("method", "optimizer"), [("mebp", "adamw"), ("mezo", "sgd")])
def test_resumed_run_reproduces_the_uninterrupted_one(method, optimizer, packed_models,
                                                      token_data, tmp_path):
    packed = packed_models["qwen3", "none"]
    options = dict(method=method, optimizer=optimizer, steps=5, schedule="cosine",
                   warmup_steps=1, lr=0.01)
    whole, _, whole_lines = run(packed, token_data, tmp_path / "whole", **options)
    _, stopped, _ = run(packed, token_data, tmp_path / "part", stop_after=2, **options)
    assert stopped.interrupted and stopped.steps == 2 and stopped.checkpoint_dir.is_dir()
    resumed, result, part_lines = run(packed, token_data, tmp_path / "part", resume=True,
                                      **options)
    assert result.steps == 5 and not result.interrupted
    assert [line["step"] for line in part_lines] == [1, 2, 3, 4, 5]
    for ours, theirs in zip(part_lines, whole_lines, strict=True):
        assert ours["loss"] == theirs["loss"]
    assert_same_adapter(resumed, whole, rtol=0)


def test_resume_refuses_different_settings(packed_models, token_data, tmp_path):
    packed = packed_models["qwen3", "none"]
    run(packed, token_data, tmp_path / "r", stop_after=1)
    with pytest.raises(ResumeError, match="lr"):
        run(packed, token_data, tmp_path / "r", resume=True, lr=0.5)


def test_resume_after_a_crash_logs_every_step_once(packed_models, token_data, tmp_path):
    packed = packed_models["qwen3", "none"]
    # Steps 1-3 ran and were logged; the last checkpoint is from step 2 (as after a crash).
    run(packed, token_data, tmp_path / "c", steps=3, checkpoint_every=2)
    _, result, lines = run(packed, token_data, tmp_path / "c", steps=5, checkpoint_every=2,
                           resume=True)
    assert result.steps == 5
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5]


def test_a_run_keeps_the_adapter_of_each_checkpoint_step(packed_models, token_data,
                                                         tmp_path):
    """Each kept adapter is, tensor for tensor, what a run stopped at that step writes; one
    resumed after a crash keeps the earlier ones and keeps the step it trains again anew."""
    packed = packed_models["qwen3", "none"]
    kept = tmp_path / "kept"
    run(packed, token_data, tmp_path / "a", steps=5, checkpoint_every=2, kept_dir=kept)
    assert kept_steps(kept) == [2, 4]
    for step in (2, 4):
        alone = run(packed, token_data, tmp_path / f"to-{step}", steps=step)[0]
        at_step = load_file(kept_adapter_dir(kept, step) / "adapter_model.safetensors")
        assert at_step.keys() == alone.keys()
        assert all(torch.equal(at_step[key], alone[key]) for key in alone)
    # a crash after step 3 of 5: resumed from step 2's checkpoint, step 4 is kept then
    again = tmp_path / "again"
    run(packed, token_data, tmp_path / "b", steps=3, checkpoint_every=2, kept_dir=again)
    before = (kept_adapter_dir(again, 2) / "adapter_model.safetensors").read_bytes()
    assert kept_steps(again) == [2]
    run(packed, token_data, tmp_path / "b", steps=5, checkpoint_every=2, kept_dir=again,
        resume=True)
    assert kept_steps(again) == [2, 4]
    assert (kept_adapter_dir(again, 2) / "adapter_model.safetensors").read_bytes() == before
    assert ((kept_adapter_dir(again, 4) / "adapter_model.safetensors").read_bytes()
            == (kept_adapter_dir(kept, 4) / "adapter_model.safetensors").read_bytes())
    # the last step, a checkpoint step too, is the run's own adapter: not kept a second time
    last = tmp_path / "last"
    final = run(packed, token_data, tmp_path / "c", steps=4, checkpoint_every=2,
                kept_dir=last)[0]
    assert kept_steps(last) == [2]
    assert all(torch.equal(final[key], at_step[key]) for key in final)  # step 4's, above


def test_mapped_checkpoints_live_on_disk_beside_the_output(packed_models, token_data, tmp_path):
    """Not in the system temp dir, which may be tmpfs (shared memory, charged like RAM)."""
    out = tmp_path / "runs" / "adapter"
    mapped: list[str] = []

    def record(_metrics) -> None:
        mapped.extend(line.split(maxsplit=5)[-1] for line in
                      Path("/proc/self/maps").read_text().splitlines() if "mebp-ckpt-" in line)

    config = TrainConfig(steps=2, seq_len=32, lora_rank=4, quant="none",
                         knobs=EngineKnobs(checkpoint_storage="mmap"))
    train(config, model_dir=packed_models["llama", "none"], data=token_data, out=out,
          memory=track_memory(), on_step=record)
    assert mapped and all(path.startswith(f"{out.parent}/mebp-ckpt-") for path in mapped)
    assert not list(out.parent.glob("mebp-ckpt-*"))  # unlinked at once: nothing left behind
