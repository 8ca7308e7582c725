"""Fixtures: each reference case built by transformers and saved with save_pretrained."""

from __future__ import annotations

from pathlib import Path

import pytest
from models_reference import CASES, SavedModel, make_hf_model


@pytest.fixture(params=sorted(CASES))
def saved(request, tmp_path: Path) -> SavedModel:
    model_type, kwargs = CASES[request.param]
    hf = make_hf_model(model_type, kwargs)
    hf.save_pretrained(tmp_path)
    return SavedModel(name=request.param, hf=hf, path=tmp_path)
