"""Gemma 3 text decoder, matching transformers' Gemma3ForCausalLM.

Differences from Llama: (1 + w) RMSNorm, four norms per block, q_norm/k_norm, an embedding
scaled by sqrt(hidden_size), a gelu-tanh MLP, sliding-window layers with their own RoPE base,
and an optional tanh soft cap on the final logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mebp_core.models.base import (
    FULL_ATTENTION,
    LAYER_TYPES,
    SLIDING_ATTENTION,
    BlockContext,
    CausalLM,
    DecoderBlock,
    RopeSpec,
    UnsupportedConfigError,
    apply_rotary,
    attend,
    get_activation,
    split_heads,
    upcast_kept_as_input,
)


@dataclass(frozen=True)
class ModelArgs:
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    rope: dict[str, RopeSpec]
    layer_types: tuple[str, ...]
    sliding_window: int | None = 4096
    attention_bias: bool = False
    query_pre_attn_scalar: float = 256
    final_logit_softcapping: float | None = None
    hidden_activation: str = "gelu_pytorch_tanh"
    model_type: str = "gemma3_text"

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelArgs:
        # defaults are Gemma3TextConfig's: multimodal hub configs omit most text fields
        if config.get("use_bidirectional_attention"):
            raise UnsupportedConfigError("gemma3: bidirectional attention is not supported")
        num_layers = config.get("num_hidden_layers", 26)
        return cls(
            hidden_size=config.get("hidden_size", 2304),
            num_hidden_layers=num_layers,
            intermediate_size=config.get("intermediate_size", 9216),
            num_attention_heads=config.get("num_attention_heads", 8),
            num_key_value_heads=config.get("num_key_value_heads", 4),
            head_dim=config.get("head_dim", 256),
            vocab_size=config.get("vocab_size", 262_208),
            max_position_embeddings=config.get("max_position_embeddings", 131_072),
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=config.get("tie_word_embeddings", True),
            rope=parse_gemma3_rope(config),
            layer_types=parse_gemma3_layer_types(config, num_layers),
            sliding_window=config.get("sliding_window", 4096),
            attention_bias=config.get("attention_bias", False),
            query_pre_attn_scalar=config.get("query_pre_attn_scalar", 256),
            final_logit_softcapping=config.get("final_logit_softcapping"),
            hidden_activation=config.get("hidden_activation", "gelu_pytorch_tanh"),
        )


def parse_gemma3_layer_types(config: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    if config.get("layer_types"):
        return tuple(config["layer_types"])
    pattern = config.get("sliding_window_pattern", 6)
    return tuple(
        SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(num_layers)
    )


def parse_gemma3_rope(config: dict[str, Any]) -> dict[str, RopeSpec]:
    """Per-layer-type RoPE; 4.x configs scale only full layers and give the local base apart."""
    params = config.get("rope_parameters") or {}
    if not any(key in params for key in LAYER_TYPES):
        params = {FULL_ATTENTION: {**params, **(config.get("rope_scaling") or {})}}
    full = dict(params.get(FULL_ATTENTION) or {})
    full.setdefault("rope_theta", config.get("rope_theta", 1_000_000.0))
    sliding = dict(params.get(SLIDING_ATTENTION) or {})
    sliding.setdefault("rope_theta", config.get("rope_local_base_freq", 10_000.0))
    max_positions = config.get("max_position_embeddings", 131_072)
    return {
        layer_type: RopeSpec.from_params(
            spec, default_theta=spec["rope_theta"], max_position_embeddings=max_positions
        )
        for layer_type, spec in ((FULL_ATTENTION, full), (SLIDING_ATTENTION, sliding))
    }


class RMSNorm(nn.Module):
    """Gemma RMSNorm: scale by (1 + w) in float32, then cast back (HF casts after the product)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        with upcast_kept_as_input(x, x32):
            x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).type_as(x)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_type: str) -> None:
        super().__init__()
        self.layer_type = layer_type
        self.head_dim = args.head_dim
        self.scale = args.query_pre_attn_scalar**-0.5
        q_dim = args.num_attention_heads * args.head_dim
        kv_dim = args.num_key_value_heads * args.head_dim
        bias = args.attention_bias
        self.q_proj = nn.Linear(args.hidden_size, q_dim, bias=bias)
        self.k_proj = nn.Linear(args.hidden_size, kv_dim, bias=bias)
        self.v_proj = nn.Linear(args.hidden_size, kv_dim, bias=bias)
        self.o_proj = nn.Linear(q_dim, args.hidden_size, bias=bias)
        self.q_norm = RMSNorm(args.head_dim, eps=args.rms_norm_eps)
        self.k_norm = RMSNorm(args.head_dim, eps=args.rms_norm_eps)

    def forward(self, x: torch.Tensor, ctx: BlockContext) -> torch.Tensor:
        q = self.q_norm(split_heads(self.q_proj(x), self.head_dim))  # (B, H, T, hd)
        k = self.k_norm(split_heads(self.k_proj(x), self.head_dim))  # (B, KV, T, hd)
        v = split_heads(self.v_proj(x), self.head_dim)  # (B, KV, T, hd)
        q, k = apply_rotary(q, k, *ctx.cos_sin[self.layer_type])
        # attn_logit_softcapping is ignored, as transformers' Gemma3 does (it is None in releases)
        out = attend(q, k, v, mask=ctx.masks[self.layer_type], scale=self.scale,
                     matmul_dtype=ctx.matmul_dtype)  # (B, T, H*hd)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=False)
        self.act_fn = get_activation(args.hidden_activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class TransformerBlock(DecoderBlock):
    def __init__(self, args: ModelArgs, layer_type: str) -> None:
        super().__init__()
        self.self_attn = Attention(args, layer_type)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.pre_feedforward_layernorm = RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def attention_part(self, h: torch.Tensor, ctx: BlockContext) -> torch.Tensor:
        return h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), ctx))

    def mlp_input(self, h: torch.Tensor) -> torch.Tensor:
        return self.pre_feedforward_layernorm(h)

    def mlp_output(self, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return h + self.post_feedforward_layernorm(y)  # y is read: its backward needs it


class Gemma3Model(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(TransformerBlock(args, t) for t in args.layer_types)
        self.norm = RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class Model(CausalLM):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.model = Gemma3Model(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    @property
    def logit_softcap(self) -> float | None:
        return self.args.final_logit_softcapping

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.model.embed_tokens(input_ids)  # (B, T, D)
        # HF rounds the float32 scale to the activation dtype (sqrt(3072) becomes 55.5 in bf16)
        scale = torch.tensor(self.args.hidden_size**0.5, dtype=torch.float32).to(h.dtype)
        return h * scale.to(h.device)
