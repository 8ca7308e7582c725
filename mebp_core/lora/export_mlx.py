"""Write a LoRA adapter in mlx-lm's format, for MLX (Python, and MLX Swift on iOS).

Format (``mlx_lm.tuner``): ``adapters.safetensors`` with ``model.layers.<i>.<key>.lora_a``
(in, r) and ``.lora_b`` (r, out), and ``adapter_config.json`` with ``fine_tune_type``,
``num_layers`` (adapted layers counted from the last) and ``lora_parameters`` (``rank``,
``scale``, ``dropout``, ``keys``: module paths within a layer). mlx-lm multiplies the product
by ``scale`` directly, so ``scale`` is PEFT's scaling (``alpha / r``, or ``/ sqrt(r)`` with
rsLoRA).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from mebp_core.atomic import staged_directory
from mebp_core.lora.peft_files import AdapterError
from mebp_core.lora.peft_io import Adapters
from mebp_core.lora.spec import LoraSpec

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapters.safetensors"
_LAYER_PATH = re.compile(r"^model\.layers\.(\d+)\.(.+)$")

ModuleShapes = Mapping[str, tuple[int, int]]


def split_layer_path(path: str) -> tuple[int, str]:
    """``model.layers.3.self_attn.q_proj`` -> ``(3, "self_attn.q_proj")``."""
    match = _LAYER_PATH.match(path)
    if match is None:
        raise AdapterError(
            f"adapter module {path} is not inside a decoder layer (model.layers.<i>.*): "
            "mlx-lm adapts only layer modules"
        )
    return int(match.group(1)), match.group(2)


def plan_layers(adapters: Adapters, num_hidden_layers: int) -> tuple[int, list[str]]:
    """mlx-lm's ``num_layers`` and ``keys`` covering every adapted module."""
    located = [split_layer_path(path) for path in adapters]
    first_layer = min(layer for layer, _ in located)
    keys = sorted({key for _, key in located})
    return num_hidden_layers - first_layer, keys


def build_mlx_tensors(
    adapters: Adapters, shapes: ModuleShapes, rank: int, layers: range, keys: list[str]
) -> dict[str, np.ndarray]:
    """Every LoRA pair mlx-lm will create; modules the adapter lacks get zeros (no effect)."""
    tensors: dict[str, np.ndarray] = {}
    for layer in layers:
        for key in keys:
            path = f"model.layers.{layer}.{key}"
            if path in adapters:
                lora_a, lora_b = (t.numpy() for t in adapters[path])
            else:
                out_features, in_features = shapes[path]
                lora_a = np.zeros((rank, in_features), np.float32)
                lora_b = np.zeros((out_features, rank), np.float32)
            tensors[path + ".lora_a"] = np.ascontiguousarray(lora_a.T)  # (in, r)
            tensors[path + ".lora_b"] = np.ascontiguousarray(lora_b.T)  # (r, out)
    return tensors


def build_mlx_config(spec: LoraSpec, num_layers: int, keys: list[str]) -> dict:
    """The fields ``mlx_lm.tuner.utils.load_adapters`` reads."""
    return {
        "fine_tune_type": "lora",
        "num_layers": num_layers,
        "lora_parameters": {
            "rank": spec.rank,
            "scale": spec.scaling,
            "dropout": 0.0,
            "keys": keys,
        },
    }


def write_mlx_adapter(
    out: Path, spec: LoraSpec, adapters: Adapters, shapes: ModuleShapes, num_hidden_layers: int
) -> Path:
    """Write ``out/`` (adapters.safetensors + adapter_config.json); replaced only once complete.

    ``shapes`` maps the base model's linear module paths to their (out, in) shapes.
    """
    num_layers, keys = plan_layers(adapters, num_hidden_layers)
    layers = range(num_hidden_layers - num_layers, num_hidden_layers)
    tensors = build_mlx_tensors(adapters, shapes, spec.rank, layers, keys)
    config = build_mlx_config(spec, num_layers, keys)
    with staged_directory(out) as staging:
        save_file(tensors, str(staging / WEIGHTS_NAME), metadata={"format": "mlx"})
        (staging / CONFIG_NAME).write_text(json.dumps(config, indent=4, sort_keys=True) + "\n")
    return out
