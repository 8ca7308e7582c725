"""Tiny transformers models of every family, saved to disk and packed through the real path."""

from __future__ import annotations

from pathlib import Path

import pytest
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
