"""What the base model's exports (Hugging Face, ``export_base.py``; GGUF,
``export_base_gguf.py``; MLX, ``export_base_mlx.py``) share: their formats and dtypes, the
name adapters give their base, the error, progress."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal, get_args

from mebp_core.errors import MebpError

BASE_NAME_PREFIX = "mebp-base-"
BaseFormat = Literal["hf", "gguf", "mlx"]
BASE_FORMATS: tuple[str, ...] = get_args(BaseFormat)
BASE_DTYPES = ("float32", "float16", "bfloat16")
GGUFQuant = Literal["q4_1", "q8_0"]  # llama.cpp's block types a GGUF base can be written in
GGUF_QUANTS: tuple[str, ...] = get_args(GGUFQuant)

Progress = Callable[[int, int, str], None]


class BaseExportError(MebpError, ValueError):
    """The base model cannot be exported as asked; ``field`` names the parameter at fault
    (the API's query parameter: format, quant, group_size, dtype)."""

    def __init__(self, message: str, field: str = "format") -> None:
        super().__init__(message)
        self.field = field


def base_model_name(model_dir: str | Path) -> str:
    """The name adapters trained on the packed model ``model_dir`` give their base, and the
    directory its export is written to by default: ``from_pretrained`` takes it as a local
    path, so an adapter loads as downloaded next to its exported base."""
    return BASE_NAME_PREFIX + Path(model_dir).resolve().name
