"""What to adapt and how: the LoRA hyper-parameters, with PEFT's semantics.

Scaling follows PEFT's ``LoraConfig``: ``lora_alpha / r`` (or ``lora_alpha / sqrt(r)`` with
``use_rslora``). The default ``alpha`` is 16 (twice the mission's rank 8), not PEFT's 8.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Short name -> module suffix under a decoder layer, in HF's names (Llama, Qwen2/3, Gemma3).
TARGET_SUFFIXES: dict[str, str] = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
_HF_TO_SHORT = {suffix.rsplit(".", 1)[1]: short for short, suffix in TARGET_SUFFIXES.items()}


def normalize_target(name: str) -> str:
    """Map ``q``/``q_proj``/``self_attn.q_proj`` to the short name ``q``."""
    key = name.strip().rsplit(".", 1)[-1]
    if key in TARGET_SUFFIXES:
        return key
    if key in _HF_TO_SHORT:
        return _HF_TO_SHORT[key]
    known = ", ".join([*TARGET_SUFFIXES, *_HF_TO_SHORT, "all"])
    raise ValueError(f"unknown LoRA target {name!r}; known targets: {known}")


def hf_target_name(short: str) -> str:
    """The HF module name PEFT's ``target_modules`` uses, e.g. ``q`` -> ``q_proj``."""
    return TARGET_SUFFIXES[short].rsplit(".", 1)[1]


class LoraSpec(BaseModel):
    """LoRA hyper-parameters; ``targets`` are normalized short names in canonical order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(default=8, ge=1)
    alpha: float = Field(default=16.0, gt=0)
    targets: tuple[str, ...] = tuple(TARGET_SUFFIXES)
    dropout: float = 0.0
    use_rslora: bool = False

    @field_validator("targets", mode="before")
    @classmethod
    def _normalize_targets(cls, value: object) -> tuple[str, ...]:
        names = value.split(",") if isinstance(value, str) else list(value)  # type: ignore[arg-type]
        names = [str(n).strip() for n in names if str(n).strip()]
        if not names:
            raise ValueError("targets must name at least one module")
        if "all" in names:
            return tuple(TARGET_SUFFIXES)
        wanted = {normalize_target(n) for n in names}
        return tuple(short for short in TARGET_SUFFIXES if short in wanted)

    @field_validator("dropout")
    @classmethod
    def _reject_dropout(cls, value: float) -> float:
        if value != 0.0:
            raise ValueError(
                f"lora dropout {value} is not supported: gradients are exact only without "
                "dropout (recomputing a block would draw a different mask); use dropout=0.0"
            )
        return value

    @property
    def scaling(self) -> float:
        """The factor on the LoRA branch, as PEFT computes it."""
        if self.use_rslora:
            return self.alpha / math.sqrt(self.rank)
        return self.alpha / self.rank

    def module_suffixes(self) -> tuple[str, ...]:
        """Suffixes of adapted module paths, e.g. ``("self_attn.q_proj", ...)``."""
        return tuple(TARGET_SUFFIXES[short] for short in self.targets)

    def hf_target_modules(self) -> list[str]:
        """``target_modules`` as PEFT writes it, e.g. ``["q_proj", "v_proj"]``."""
        return [hf_target_name(short) for short in self.targets]

    def target_module_paths(self, module_names: Iterable[str]) -> list[str]:
        """The module paths (e.g. ``model.layers.0.self_attn.q_proj``) this spec adapts."""
        suffixes = self.module_suffixes()
        return [
            name
            for name in module_names
            if any(name == s or name.endswith("." + s) for s in suffixes)
        ]
