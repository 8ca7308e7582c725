"""What the planner needs to know of an architecture, read from its Hugging Face config
without torch or transformers (a test holds it to the engine's own model arguments)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

from mebp_core.errors import MebpError
from mebp_core.store.config_defaults import supported_text_config, with_defaults
from mebp_core.store.preset_configs import PRESET_CONFIGS, PRESET_PREFIX

# transformers' default where hub configs omit it (the shapes' defaults: config_defaults.py)
_DEFAULT_MAX_POSITIONS = {"llama": 2048, "qwen2": 32768, "qwen3": 32768, "gemma3_text": 131072}


class PlanInputError(MebpError, ValueError):
    """The planner cannot read the model or a setting it was given."""


@dataclass(frozen=True)
class Architecture:
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    max_positions: int
    logit_softcap: float | None = None  # logits = c * tanh(logits / c) (Gemma's final cap)

    def projections(self) -> MappingProxyType[str, tuple[int, int]]:
        """(out, in) of each frozen projection of one block, by module suffix."""
        return self._projections

    @cached_property
    def _projections(self) -> MappingProxyType[str, tuple[int, int]]:
        # the planner asks for these for every weight of every candidate: made once, read-only
        d, q, kv, i = (self.hidden_size, self.num_heads * self.head_dim,
                       self.num_kv_heads * self.head_dim, self.intermediate_size)
        return MappingProxyType({"q_proj": (q, d), "k_proj": (kv, d), "v_proj": (kv, d),
                                 "o_proj": (d, q), "gate_proj": (i, d), "up_proj": (i, d),
                                 "down_proj": (d, i)})

    @property
    def residual_output_projection(self) -> str | None:
        """The projection whose output goes straight into a block's output sum (the engine's
        recompute for a backward skips its product): the MLP's down projection, except where
        it is normed first (Gemma 3)."""
        return None if self.model_type == "gemma3_text" else "down_proj"

    @property
    def qk_norm(self) -> bool:
        """Whether q and k pass a per-head RMSNorm before RoPE (Qwen3, Gemma 3)."""
        return self.model_type in ("qwen3", "gemma3_text")

    def attention_norm_width(self) -> int:
        """Elements per token that a block's attention part normalizes (each RMSNorm in
        float32): its input, Gemma 3's attention output, and q and k with a q/k norm."""
        width = self.hidden_size * (2 if self.model_type == "gemma3_text" else 1)
        if self.qk_norm:
            width += (self.num_heads + self.num_kv_heads) * self.head_dim
        return width

    def block_params(self) -> int:
        return sum(o * i for o, i in self.projections().values())

    def head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def head_weight_name(self) -> str:
        return "model.embed_tokens.weight" if self.tied_embeddings else "lm_head.weight"

    def frozen_weights(self) -> tuple[tuple[str, int], ...]:
        """(HF name, parameter count) of every lazily decompressed matrix: projections, head."""
        return self._frozen_weights

    @cached_property
    def _frozen_weights(self) -> tuple[tuple[str, int], ...]:
        names = []
        for layer in range(self.num_layers):
            group = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
                     "o_proj": "self_attn"}
            for suffix, (out, inp) in self.projections().items():
                names.append((f"model.layers.{layer}.{group.get(suffix, 'mlp')}.{suffix}.weight",
                              out * inp))
        names.append((self.head_weight_name(), self.head_params()))
        return tuple(names)

    def parameter_count(self) -> int:
        embed = self.vocab_size * self.hidden_size
        return embed + self.num_layers * self.block_params() + \
            (0 if self.tied_embeddings else self.head_params())


def architecture_from_config(config: dict[str, Any]) -> Architecture:
    """The planner's view of a config.json dict (multimodal Gemma 3: its text config), with
    transformers' defaults where it omits a field."""
    if not isinstance(config, dict):
        raise PlanInputError(f"config.json: an object of fields, not {type(config).__name__}")
    try:
        config = with_defaults(supported_text_config(config))
    except MebpError as exc:  # an unsupported model_type, a missing field
        raise PlanInputError(str(exc)) from None
    model_type = config["model_type"]
    return Architecture(
        model_type=model_type, hidden_size=_whole(config, "hidden_size"),
        intermediate_size=_whole(config, "intermediate_size"),
        num_layers=_whole(config, "num_hidden_layers"),
        num_heads=_whole(config, "num_attention_heads"),
        num_kv_heads=_whole(config, "num_key_value_heads"), head_dim=_whole(config, "head_dim"),
        vocab_size=_whole(config, "vocab_size"),
        tied_embeddings=bool(config["tie_word_embeddings"]),
        max_positions=_whole({"max_position_embeddings": _DEFAULT_MAX_POSITIONS[model_type],
                              **config}, "max_position_embeddings"),
        logit_softcap=config.get("final_logit_softcapping") if
        model_type == "gemma3_text" else None)


def _whole(config: dict[str, Any], field: str) -> int:
    value = config[field]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlanInputError(f"config.json: {field} must be a whole number, got {value!r}")
    return value


def load_architecture(model: str | Path) -> Architecture:
    """``preset:NAME``, or a directory (Hugging Face or packed) holding config.json."""
    spec = str(model)
    if spec.startswith(PRESET_PREFIX):
        return _preset_architecture(spec.removeprefix(PRESET_PREFIX))
    path = Path(spec) / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlanInputError(f"{model}: no config.json (expected preset:NAME or a model "
                             "directory)") from None
    except json.JSONDecodeError as exc:
        raise PlanInputError(f"{path}: not valid JSON ({exc})") from None
    return architecture_from_config(config)


@cache
def _preset_architecture(name: str) -> Architecture:
    """One instance per preset (they never change): the planner's memos then find theirs by
    identity rather than comparing every field."""
    if name not in PRESET_CONFIGS:
        raise PlanInputError(f"unknown preset {name!r} "
                             f"(known: {', '.join(sorted(PRESET_CONFIGS))})")
    return architecture_from_config(PRESET_CONFIGS[name])
