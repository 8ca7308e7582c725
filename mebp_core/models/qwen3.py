"""Qwen3, matching transformers' Qwen3ForCausalLM (per-head q_norm/k_norm, explicit head_dim)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mebp_core.models.base import (
    BlockContext,
    CausalLM,
    PreNormBlock,
    RMSNorm,
    RopeSpec,
    apply_rotary,
    attend,
    get_activation,
    parse_layer_types,
    parse_rope,
    split_heads,
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
    sliding_window: int | None = None
    attention_bias: bool = False
    hidden_act: str = "silu"
    model_type: str = "qwen3"

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelArgs:
        heads = config["num_attention_heads"]
        layer_types, sliding_window = parse_layer_types(config)
        rope = parse_rope(config)
        return cls(
            hidden_size=config["hidden_size"],
            num_hidden_layers=config["num_hidden_layers"],
            intermediate_size=config["intermediate_size"],
            num_attention_heads=heads,
            # as transformers: omitted, 32; null, the attention heads
            num_key_value_heads=config.get("num_key_value_heads", 32) or heads,
            head_dim=config.get("head_dim", 128),
            vocab_size=config["vocab_size"],
            max_position_embeddings=config.get("max_position_embeddings", 32768),
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=config.get("tie_word_embeddings", False),
            rope={t: rope for t in set(layer_types)},
            layer_types=layer_types,
            sliding_window=sliding_window,
            attention_bias=config.get("attention_bias", False),
            hidden_act=config.get("hidden_act", "silu"),
        )


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_type: str) -> None:
        super().__init__()
        self.layer_type = layer_type
        self.head_dim = args.head_dim
        self.scale = args.head_dim**-0.5
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
        out = attend(q, k, v, mask=ctx.masks[self.layer_type], scale=self.scale,
                     matmul_dtype=ctx.matmul_dtype)  # (B, T, H*hd)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=False)
        self.act_fn = get_activation(args.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class TransformerBlock(PreNormBlock):
    def __init__(self, args: ModelArgs, layer_type: str) -> None:
        super().__init__()
        self.self_attn = Attention(args, layer_type)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class Qwen3Model(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(TransformerBlock(args, t) for t in args.layer_types)
        self.norm = RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class Model(CausalLM):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.model = Qwen3Model(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
