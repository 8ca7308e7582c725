"""What the base model's exports (Hugging Face, ``export_base.py``; GGUF,
``export_base_gguf.py``) share: the name adapters give their base, the error, progress."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mebp_core.errors import MebpError

BASE_NAME_PREFIX = "mebp-base-"

Progress = Callable[[int, int, str], None]


class BaseExportError(MebpError, ValueError):
    """The base model cannot be exported as asked."""


def base_model_name(model_dir: str | Path) -> str:
    """The name adapters trained on the packed model ``model_dir`` give their base, and the
    directory its export is written to by default: ``from_pretrained`` takes it as a local
    path, so an adapter loads as downloaded next to its exported base."""
    return BASE_NAME_PREFIX + Path(model_dir).resolve().name
