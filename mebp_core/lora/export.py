"""Export a PEFT adapter (the canonical artifact) for an on-device runtime.

``peft``: the adapter directory itself, checked and copied. ``mlx``: mlx-lm's adapter
directory (MLX, MLX Swift). ``gguf``: one llama.cpp LoRA file. Every format is checked against
the base model's config first, so a mismatched adapter fails here, not on the phone.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Literal, get_args

from mebp_core.atomic import staged_directory
from mebp_core.lora.export_gguf import write_gguf_adapter
from mebp_core.lora.export_mlx import write_mlx_adapter
from mebp_core.lora.peft_io import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    AdapterError,
    check_adapter_fits,
    load_peft_adapter,
)
from mebp_core.store.shapes import expected_shapes, full_text_config

ExportFormat = Literal["peft", "mlx", "gguf"]
EXPORT_FORMATS: tuple[str, ...] = get_args(ExportFormat)


def read_text_config(base_config: dict[str, Any]) -> dict[str, Any]:
    """The base model's text config with transformers' defaults, or an ``AdapterError``."""
    try:
        return full_text_config(base_config)
    except (ValueError, KeyError, TypeError) as exc:
        raise AdapterError(f"base_config is not a supported model config: {exc}") from exc


def linear_shapes(base_config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """``{module path: (out, in)}`` for every linear weight of the base model."""
    return {
        name.removesuffix(".weight"): shape
        for name, shape in expected_shapes(base_config).items()
        if name.endswith(".weight") and len(shape) == 2
    }


def copy_peft_adapter(peft_dir: Path, out: Path) -> Path:
    """Copy the two PEFT files to ``out``; an existing ``out`` is replaced only once complete."""
    with staged_directory(out) as staging:
        for name in (WEIGHTS_NAME, CONFIG_NAME):
            shutil.copyfile(peft_dir / name, staging / name)
    return out


def export_adapter(
    peft_dir: Path, fmt: ExportFormat, out: Path, *, base_config: dict[str, Any]
) -> Path:
    """Write the adapter in ``peft_dir`` as ``fmt`` to ``out`` (a directory; a file for gguf).

    ``base_config`` is the base model's HF ``config.json`` as a dict.
    """
    if fmt not in EXPORT_FORMATS:
        raise AdapterError(f"unknown export format {fmt!r} (known: {', '.join(EXPORT_FORMATS)})")
    peft_dir, out = Path(peft_dir), Path(out)
    spec, adapters = load_peft_adapter(peft_dir)
    config = read_text_config(base_config)
    shapes = linear_shapes(base_config)
    check_adapter_fits(adapters, shapes)
    if fmt == "peft":
        return copy_peft_adapter(peft_dir, out)
    if fmt == "mlx":
        return write_mlx_adapter(out, spec, adapters, shapes, config["num_hidden_layers"])
    return write_gguf_adapter(out, spec, adapters, config)
