"""Read and write LoRA adapters in PEFT's on-disk format, atomically.

Format: ``adapter_model.safetensors`` with ``base_model.model.<path>.lora_A.weight`` (r, in)
and ``.lora_B.weight`` (out, r) in float32, plus ``adapter_config.json`` with PEFT's
``LoraConfig`` keys. PEFT fills any key we leave out with its default.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from pydantic import ValidationError
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from mebp_core.atomic import check_replaceable, staged_directory
from mebp_core.lora.peft_files import ADAPTER_FILES, CONFIG_NAME, WEIGHTS_NAME, AdapterError
from mebp_core.lora.spec import LoraSpec, normalize_target

KEY_PREFIX = "base_model.model."
_A_SUFFIX, _B_SUFFIX = ".lora_A.weight", ".lora_B.weight"

Adapters = dict[str, tuple[torch.Tensor, torch.Tensor]]


def build_adapter_config(spec: LoraSpec, base_model_name_or_path: str | None,
                         target_modules: str | None = None) -> dict:
    """PEFT ``LoraConfig`` fields for ``spec`` (inference-ready, as PEFT saves them).

    ``target_modules`` overrides the module names with a PEFT regex (e.g. to keep a
    multimodal model's vision tower out of the adapter).
    """
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "target_modules": target_modules or spec.hf_target_modules(),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": spec.use_rslora,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "layers_to_transform": None,
        "layers_pattern": None,
        "base_model_name_or_path": base_model_name_or_path,
        "revision": None,
        "inference_mode": True,
    }


def save_peft_adapter(
    out_dir: str | os.PathLike,
    adapters: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    spec: LoraSpec,
    base_model_name_or_path: str | None,
    model_type: str | None = None,
    target_modules: str | None = None,
) -> Path:
    """Write a PEFT adapter to ``out_dir``; an existing one is replaced only once complete."""
    out = Path(out_dir)
    check_replaceable(out, ADAPTER_FILES)
    tensors = {}
    for path, (lora_a, lora_b) in adapters.items():
        tensors[KEY_PREFIX + path + _A_SUFFIX] = lora_a.detach().to(torch.float32).contiguous()
        tensors[KEY_PREFIX + path + _B_SUFFIX] = lora_b.detach().to(torch.float32).contiguous()
    # model_type rides in the safetensors metadata: PEFT warns about unknown config keys.
    metadata = {"format": "pt", **({"model_type": model_type} if model_type else {})}
    config = build_adapter_config(spec, base_model_name_or_path, target_modules)
    with staged_directory(out) as staging:
        save_file(tensors, str(staging / WEIGHTS_NAME), metadata=metadata)
        sort_safetensors_header(staging / WEIGHTS_NAME)
        (staging / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


def sort_safetensors_header(path: Path) -> None:
    """Rewrite the header in place with its keys sorted, so identical tensors give identical
    bytes: safetensors writes its metadata map in a per-process hash order. The header keeps
    its length (space padding is part of the format), so no offset moves."""
    with open(path, "r+b") as file:
        length = int.from_bytes(file.read(8), "little")
        header = json.loads(file.read(length))
        canonical = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        if len(canonical) > length:  # cannot happen for a header safetensors wrote
            raise AdapterError(f"{path}: unexpected safetensors header layout")
        file.seek(8)
        file.write(canonical.ljust(length))


def read_adapter_config(directory: Path) -> dict:
    """The parsed ``adapter_config.json``, checked to be a plain LoRA config."""
    path = directory / CONFIG_NAME
    if not path.is_file():
        raise AdapterError(f"{path} is missing")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AdapterError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise AdapterError(f"{path} must hold a JSON object")
    if config.get("peft_type") != "LORA":
        raise AdapterError(f"{path}: peft_type is {config.get('peft_type')!r}, expected 'LORA'")
    unsupported = {
        "use_dora": bool(config.get("use_dora")),
        "fan_in_fan_out": bool(config.get("fan_in_fan_out")),
        "rank_pattern": bool(config.get("rank_pattern")),
        "alpha_pattern": bool(config.get("alpha_pattern")),
        "bias": config.get("bias", "none") != "none",
    }
    for key, bad in unsupported.items():
        if bad:
            raise AdapterError(f"{path}: {key}={config[key]!r} is not supported")
    if not isinstance(config.get("r"), int) or "lora_alpha" not in config:
        raise AdapterError(f"{path}: needs integer 'r' and 'lora_alpha'")
    return config


def read_adapter_tensors(directory: Path, rank: int) -> Adapters:
    """``{module path: (A, B)}`` from the safetensors file, checked against ``rank``."""
    path = directory / WEIGHTS_NAME
    if not path.is_file():
        raise AdapterError(f"{path} is missing")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise AdapterError(f"{path} is not a readable safetensors file: {exc}") from exc
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        stem = key.removeprefix(KEY_PREFIX)
        side = "A" if stem.endswith(_A_SUFFIX) else "B" if stem.endswith(_B_SUFFIX) else None
        if not key.startswith(KEY_PREFIX) or side is None:
            raise AdapterError(f"{path}: unexpected key {key!r} (only lora_A/lora_B weights)")
        halves.setdefault(stem[: -len(_A_SUFFIX)], {})[side] = tensor
    adapters: Adapters = {}
    for module, pair in halves.items():
        for side in "AB":
            if side not in pair:
                raise AdapterError(f"{path}: {KEY_PREFIX}{module}.lora_{side}.weight is missing")
        lora_a, lora_b = pair["A"], pair["B"]
        if lora_a.dim() != 2 or lora_b.dim() != 2:
            raise AdapterError(f"{path}: {module} lora_A/lora_B must be 2-D matrices")
        if lora_a.shape[0] != rank or lora_b.shape[1] != rank:
            raise AdapterError(
                f"{path}: {module} has rank {lora_a.shape[0]} (A {tuple(lora_a.shape)}, "
                f"B {tuple(lora_b.shape)}) but {CONFIG_NAME} says r={rank}"
            )
        adapters[module] = (lora_a.to(torch.float32), lora_b.to(torch.float32))
    if not adapters:
        raise AdapterError(f"{path} holds no LoRA weights")
    return adapters


def build_spec(config: dict, adapters: Adapters, directory: Path) -> LoraSpec:
    """A ``LoraSpec`` from a PEFT config; targets come from the tensors' module names.

    Dropout is not carried over: it only affects training, which here runs without it.
    """
    try:
        targets = sorted({normalize_target(path) for path in adapters})
        return LoraSpec(
            rank=config["r"],
            alpha=float(config["lora_alpha"]),
            targets=tuple(targets),
            use_rslora=bool(config.get("use_rslora", False)),
        )
    except (ValueError, ValidationError) as exc:
        raise AdapterError(f"{directory}: cannot use this adapter: {exc}") from exc


def load_peft_adapter(directory: str | os.PathLike) -> tuple[LoraSpec, Adapters]:
    """Read a PEFT LoRA adapter directory into ``(spec, {module path: (A, B)})``."""
    root = Path(directory)
    if not root.is_dir():
        raise AdapterError(f"adapter directory {root} does not exist")
    config = read_adapter_config(root)
    adapters = read_adapter_tensors(root, config["r"])
    return build_spec(config, adapters, root), adapters


def check_adapter_fits(
    adapters: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    expected_shapes: Mapping[str, tuple[int, int]],
) -> None:
    """Raise ``AdapterError`` unless every adapted module exists with shape (out, in)."""
    for path, (lora_a, lora_b) in adapters.items():
        if path not in expected_shapes:
            raise AdapterError(f"adapter module {path} does not exist in the model")
        out_features, in_features = expected_shapes[path]
        if lora_a.shape[1] != in_features or lora_b.shape[0] != out_features:
            raise AdapterError(
                f"adapter module {path} does not fit: model weight is "
                f"(out={out_features}, in={in_features}), adapter has A {tuple(lora_a.shape)} "
                f"and B {tuple(lora_b.shape)}"
            )
