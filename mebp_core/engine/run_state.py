"""Training checkpoints: everything a resumed run needs to continue exactly.

A checkpoint directory holds ``adapter.safetensors`` (the LoRA tensors), ``optimizer.pt``
(each block optimizer's state), ``rng.pt`` and ``state.json`` (step, micro-batches consumed,
the config it was trained with). It is written next to its final place and renamed over it,
so a crash mid-save leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from mebp_core.atomic import staged_directory
from mebp_core.config import TrainConfig
from mebp_core.engine.model import EngineModel
from mebp_core.engine.optim import BlockOptimizer
from mebp_core.errors import MebpError

STATE_VERSION = 1
CHECKPOINT_FILES = {"adapter.safetensors", "optimizer.pt", "rng.pt", "state.json"}


class ResumeError(MebpError, ValueError):
    """A checkpoint is missing, unreadable, or belongs to a different run."""


@dataclass(frozen=True)
class RunPosition:
    step: int  # optimizer steps completed
    batches_consumed: int  # micro-batches drawn from the data stream


def save_run_state(directory: Path, engine: EngineModel, optimizers: list[BlockOptimizer],
                   position: RunPosition, config: TrainConfig) -> Path:
    directory = Path(directory)
    with staged_directory(directory) as staging:
        tensors = {}
        for path, (a, b) in engine.adapter_tensors().items():
            tensors[f"{path}.lora_A.weight"] = a.contiguous()
            tensors[f"{path}.lora_B.weight"] = b.contiguous()
        save_file(tensors, staging / "adapter.safetensors")
        torch.save([opt.state_dict() for opt in optimizers], staging / "optimizer.pt")
        torch.save(torch.get_rng_state(), staging / "rng.pt")
        state = {"version": STATE_VERSION, "step": position.step,
                 "batches_consumed": position.batches_consumed, "config": config.resume_key()}
        (staging / "state.json").write_text(json.dumps(state, indent=2))
    return directory


def load_run_state(directory: Path, engine: EngineModel, optimizers: list[BlockOptimizer],
                   config: TrainConfig) -> RunPosition:
    """Restore LoRA tensors, optimizer state and RNG from ``directory``; return the position."""
    directory = Path(directory)
    state = _read_state(directory)
    # a setting added since the checkpoint was written was at its default then
    saved = {**TrainConfig().resume_key(), **state["config"]}
    if saved != config.resume_key():
        changed = sorted(k for k, v in config.resume_key().items() if saved.get(k) != v)
        raise ResumeError(f"{directory}: checkpoint was trained with different settings "
                          f"({', '.join(changed)}); resume with the same ones")
    try:
        tensors = load_file(directory / "adapter.safetensors")
        _check_tensors_fit(directory, tensors, engine)
        with torch.no_grad():
            for path, module in engine.lora.items():
                module.lora_A.weight.copy_(tensors[f"{path}.lora_A.weight"])
                module.lora_B.weight.copy_(tensors[f"{path}.lora_B.weight"])
        saved = torch.load(directory / "optimizer.pt", weights_only=True)
        for optimizer, optimizer_state in zip(optimizers, saved, strict=True):
            optimizer.load_state_dict(optimizer_state)
        torch.set_rng_state(torch.load(directory / "rng.pt", weights_only=True))
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        if isinstance(exc, ResumeError):
            raise
        raise ResumeError(f"{directory}: unreadable or mismatched checkpoint ({exc})") from exc
    return RunPosition(state["step"], state["batches_consumed"])


def _check_tensors_fit(directory: Path, tensors: dict, engine: EngineModel) -> None:
    for path, module in engine.lora.items():
        for name, param in ((f"{path}.lora_A.weight", module.lora_A.weight),
                            (f"{path}.lora_B.weight", module.lora_B.weight)):
            if name not in tensors or tensors[name].shape != param.shape:
                found = tuple(tensors[name].shape) if name in tensors else "nothing"
                raise ResumeError(f"{directory}: checkpoint has {found} for {name}, the model "
                                  f"needs {tuple(param.shape)}: it belongs to another model")


def _read_state(directory: Path) -> dict:
    path = directory / "state.json"
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResumeError(
            f"{directory}: no checkpoint to resume from (state.json missing)") from None
    except json.JSONDecodeError as exc:
        raise ResumeError(f"{path}: unreadable checkpoint state ({exc})") from exc
    if state.get("version") != STATE_VERSION:
        raise ResumeError(f"{path}: checkpoint version {state.get('version')!r} is not "
                          f"{STATE_VERSION}")
    return state
