"""Tiny transformers models of every family, saved to disk and packed through the real path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from engine_fixtures import FAMILIES, save_tiny_model

from mebp_core.store.pack import pack_model


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """family -> Hugging Face directory with float32 random weights."""
    root = tmp_path_factory.mktemp("hf")
    return {family: save_tiny_model(family, root / family) for family in FAMILIES}


@pytest.fixture(scope="session")
def packed_models(tiny_models, tmp_path_factory) -> dict[tuple[str, str], Path]:
    """(family, quant) -> packed directory, packed lazily on first use."""
    root = tmp_path_factory.mktemp("packed")
    cache: dict[tuple[str, str], Path] = {}

    class Packed(dict):
        def __missing__(self, key):
            family, quant = key
            out = pack_model(tiny_models[family], root / f"{family}-{quant}", quant=quant,
                             group_size=32)
            self[key] = Path(out)
            return self[key]

    return Packed(cache)


@pytest.fixture(scope="module")
def token_data(tmp_path_factory) -> Path:
    """Four rows of random token ids, for runs that need data, not a text."""
    gen = torch.Generator().manual_seed(0)
    path = tmp_path_factory.mktemp("data") / "tokens.jsonl"
    rows = [{"input_ids": torch.randint(0, 300, (20,), generator=gen).tolist()}
            for _ in range(4)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
