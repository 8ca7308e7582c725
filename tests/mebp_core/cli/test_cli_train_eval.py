"""`mebp pack`, `mebp train` and `mebp eval` end to end through the real command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import peft
import pytest
import torch
import transformers

from mebp_core.store.presets import save_preset_as_hf

METRIC_KEYS = {"step", "loss", "step_time_s", "peak_mb", "peak_anon_mb", "footprint_mb"}


def run_mebp(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MEBP_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "mebp_core.cli", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=300)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    return save_preset_as_hf("tiny", tmp_path_factory.mktemp("tiny") / "hf")


def token_rows(seed: int, count: int = 3, length: int = 24) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, 256, (length,), generator=gen).tolist()}
            for _ in range(count)]


def peft_mean_loss(hf_dir: Path, adapter: Path, rows: list[dict]) -> float:
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(model, adapter)
    total, tokens = 0.0, 0
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row["input_ids"]])
            n = ids.shape[1] - 1
            total += float(model(input_ids=ids, labels=ids).loss) * n
            tokens += n
    return total / tokens


def test_train_then_eval_matches_transformers_and_peft(warm_cache, tiny_hf, tmp_path):
    rows = token_rows(seed=0)
    data = write_jsonl(tmp_path / "train.jsonl", rows)
    adapter, metrics = tmp_path / "adapter", tmp_path / "metrics.jsonl"
    trained = run_mebp("train", "--model", tiny_hf, "--data", data, "--out", adapter,
                       "--steps", 3, "--seq-len", 32, "--quant", "none", "--lr", "0.05",
                       "--metrics", metrics, cache=warm_cache)
    assert trained.returncode == 0, trained.stderr
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert all(METRIC_KEYS <= line.keys() for line in lines)
    assert all(line["footprint_mb"] >= 0 and line["peak_anon_mb"] > 0 for line in lines)
    assert {p.name for p in adapter.iterdir()} == {"adapter_config.json",
                                                  "adapter_model.safetensors"}

    evaluated = run_mebp("eval", "--model", tiny_hf, "--data", data, "--adapter", adapter,
                         "--quant", "none", "--seq-len", 32, "--json", cache=warm_cache)
    assert evaluated.returncode == 0, evaluated.stderr
    report = json.loads(evaluated.stdout)
    assert report["tokens"] == sum(len(r["input_ids"]) - 1 for r in rows)
    assert 0.0 <= report["token_accuracy"] <= 1.0
    assert report["loss"] == pytest.approx(peft_mean_loss(tiny_hf, adapter, rows), rel=1e-5)


def test_pack_writes_a_store(warm_cache, tmp_path):
    out = tmp_path / "packed"
    result = run_mebp("pack", "preset:tiny", out, "--quant", "int8", cache=warm_cache)
    assert result.returncode == 0, result.stderr
    assert (out / "model.mebp").is_file() and (out / "config.json").is_file()


@pytest.fixture(scope="module")
def good_data(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("data") / "ok.jsonl", token_rows(seed=1))


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "preset:nope"], "unknown preset"),
    (["--lora-rank", "0"], "--lora-rank"),
    (["--lora-targets", "q,bogus"], "bogus"),
    (["--seq-len", "100000"], "max_position_embeddings"),
])
def test_bad_options_fail_clearly(warm_cache, args, message, good_data, tmp_path):
    options = {"--model": "preset:tiny", "--data": str(good_data), "--out": str(tmp_path / "o"),
               "--steps": "1", "--seq-len": "32"}
    options.update(dict(zip(args[::2], args[1::2], strict=True)))
    result = run_mebp("train", *[x for kv in options.items() for x in kv],
                      cache=warm_cache)
    assert result.returncode == 2
    assert message in result.stderr.lower()
    assert not (tmp_path / "o").exists()


def test_malformed_jsonl_names_the_line_and_writes_nothing(warm_cache, tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"text": "fine"}\n{"text": "broken"\n')
    result = run_mebp("train", "--model", "preset:tiny", "--data", data, "--out",
                      tmp_path / "o", "--steps", "1", "--seq-len", "32",
                      cache=warm_cache)
    assert result.returncode == 2
    assert f"{data}:2:" in result.stderr
    assert not (tmp_path / "o").exists()


def test_adapter_for_another_model_is_refused(warm_cache, tmp_path, good_data):
    first = run_mebp("train", "--model", "preset:tiny", "--data", good_data, "--out",
                     tmp_path / "a", "--steps", "1", "--seq-len", "32", cache=warm_cache)
    assert first.returncode == 0, first.stderr
    other = transformers.Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=96,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, tie_word_embeddings=True)
    transformers.AutoModelForCausalLM.from_config(other).save_pretrained(tmp_path / "other")
    result = run_mebp("train", "--model", tmp_path / "other", "--data", good_data, "--out",
                      tmp_path / "b", "--init-adapter", tmp_path / "a", "--steps", "1",
                      "--seq-len", "32", cache=warm_cache)
    assert result.returncode == 2
    assert str(tmp_path / "a") in result.stderr and "does not fit" in result.stderr
    assert "adapter module model.layers.0." in result.stderr  # names the module and shapes
    assert not (tmp_path / "b").exists()


def test_export_writes_every_format_and_refuses_another_model(warm_cache, tmp_path,
                                                             good_data):
    trained = run_mebp("train", "--model", "preset:tiny", "--data", good_data, "--out",
                       tmp_path / "a", "--steps", "1", "--seq-len", "32", cache=warm_cache)
    assert trained.returncode == 0, trained.stderr
    expected = {"peft": "adapter_model.safetensors", "mlx": "adapters.safetensors"}
    for fmt in ("peft", "mlx", "gguf"):
        out = tmp_path / f"export-{fmt}"
        result = run_mebp("export", tmp_path / "a", out, "--format", fmt, "--model",
                          "preset:tiny", cache=warm_cache)
        assert result.returncode == 0, result.stderr
        assert (out / expected[fmt]).is_file() if fmt in expected else out.is_file()
    refused = run_mebp("export", tmp_path / "a", tmp_path / "bad", "--format", "gguf",
                       "--model", "preset:smollm2-135m", cache=warm_cache)
    assert refused.returncode == 2
    assert str(tmp_path / "a") in refused.stderr and "does not fit" in refused.stderr
    assert not (tmp_path / "bad").exists()


def test_skip_malformed_counts_the_skipped_lines(warm_cache, tmp_path):
    data = tmp_path / "mixed.jsonl"
    data.write_text('{"text": "good row"}\nnot json\n{"text": "another good row"}\n')
    result = run_mebp("train", "--model", "preset:tiny", "--data", data, "--out",
                      tmp_path / "o", "--steps", "1", "--seq-len", "32", "--skip-malformed",
                      cache=warm_cache)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["skipped_rows"] == 1
