"""A model spec's Hugging Face config, read without packing anything or importing torch (the
API checks jobs, fleets and base downloads with it)."""

from __future__ import annotations

import json
from pathlib import Path

from mebp_core.store.errors import StoreError
from mebp_core.store.preset_configs import PRESET_PREFIX, preset_config


def source_config(spec: str | Path) -> dict:
    """The Hugging Face config of a model spec: ``preset:<name>`` or a checkpoint directory."""
    if isinstance(spec, str) and spec.startswith(PRESET_PREFIX):
        return preset_config(spec[len(PRESET_PREFIX):])
    config_path = Path(spec) / "config.json"
    try:
        return json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StoreError(f"{config_path}: cannot read the model's config ({exc})") from exc
