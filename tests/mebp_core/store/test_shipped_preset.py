"""The pretrained pycode-12m preset: its shipped weights load through `preset:NAME` and have
learned Python; re-packing reproduces them; caches key on the shipped file's contents."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from mebp_core.engine.evaluate import evaluate_dataset
from mebp_core.store import resolve, shipped
from mebp_core.store.errors import PackError
from mebp_core.store.format import STORE_FILENAME
from mebp_core.store.pack import pack_model
from mebp_core.store.preset_configs import SHIPPED_PRESETS, preset_config
from mebp_core.store.presets import PresetSource, preset_parameter_count
from mebp_core.store.reader import open_store
from mebp_core.store.resolve import cache_key, resolve_model

PRESET = "pycode-12m"
# Two stdlib files the preset was not trained on (benchmarks/pycode_corpus.py holds them out).
HELD_OUT_SAMPLE = Path(__file__).parent / "data" / "pycode_held_out_sample.jsonl"


@pytest.fixture(scope="module")
def packed_preset(tmp_path_factory) -> Path:
    """`preset:pycode-12m` packed at the shipped int4/g64 through the cache, as `mebp` does."""
    return resolve_model(f"preset:{PRESET}", "int4", 64,
                         cache_dir=tmp_path_factory.mktemp("cache"))


def test_the_shipped_store_holds_the_presets_config():
    assert PRESET in SHIPPED_PRESETS
    store_dir = shipped.shipped_store_dir(PRESET)
    assert json.loads((store_dir / "config.json").read_text()) == preset_config(PRESET)
    assert (store_dir / STORE_FILENAME).stat().st_size < 10 << 20
    assert 12e6 < preset_parameter_count(PRESET) < 13e6


def test_the_preset_predicts_held_out_python_far_better_than_chance(packed_preset):
    report = evaluate_dataset(packed_preset, HELD_OUT_SAMPLE, seq_len=256, batch_size=16)
    chance = math.log(preset_config(PRESET)["vocab_size"])
    assert report["tokens"] > 5000
    assert report["loss"] < 0.6 * chance, report


def test_int4_repacking_reproduces_the_shipped_tensors(packed_preset):
    with open_store(shipped.shipped_store_dir(PRESET)) as ship, open_store(packed_preset) as got:
        assert ship.names() == got.names()
        for name in ship.names():
            a, b = ship.raw(name), got.raw(name)
            assert torch.equal(a.data, b.data), name
            if a.bits is not None:
                assert torch.equal(a.scales, b.scales) and torch.equal(a.biases, b.biases), name


def test_other_quantizations_are_made_from_the_shipped_values(tmp_path):
    out = pack_model(f"preset:{PRESET}", tmp_path / "none", quant="none")
    name = "model.layers.3.mlp.down_proj.weight"
    with open_store(shipped.shipped_store_dir(PRESET)) as ship, open_store(out) as plain:
        assert torch.equal(plain.dequantize(name), ship.dequantize(name))
        assert plain.header["source"]["shipped_sha256"] == shipped.shipped_sha256(PRESET)


def test_new_shipped_weights_get_a_new_cache_entry(tmp_path, monkeypatch):
    before = cache_key(f"preset:{PRESET}", "int4", 64)
    assert shipped.shipped_sha256(PRESET)[:16] in before
    copy = tmp_path / "shipped"
    shutil.copytree(shipped.SHIPPED_DIR, copy)
    with open(copy / PRESET / STORE_FILENAME, "r+b") as f:  # one byte of the data changed
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    monkeypatch.setattr(shipped, "SHIPPED_DIR", copy)
    assert cache_key(f"preset:{PRESET}", "int4", 64) != before
    assert resolve.packed_dir(f"preset:{PRESET}", cache_dir=tmp_path).name != before


def test_a_shipped_preset_has_no_seed_and_unknown_presets_still_fail_clearly(tmp_path):
    with pytest.raises(PackError, match="ships trained weights"):
        PresetSource(PRESET, seed=1)
    with pytest.raises(PackError, match=r"unknown preset 'pycode-13m' \(known: .*pycode-12m"):
        resolve_model("preset:pycode-13m", cache_dir=tmp_path)
