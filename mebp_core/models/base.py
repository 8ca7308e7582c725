"""Pieces shared by the architecture files: config parsing, rotary tables, masks, attention.

Everything here mirrors the semantics of the installed transformers 5.x modeling code so the
architecture files can reproduce its logits to float32 round-off.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mebp_core.errors import MebpError
from mebp_core.models.saved_tensors import remade_when_read

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)


@dataclass(frozen=True)
class Activation:
    """An MLP's activation, and the op autograd runs for its backward: (grad, input) ->
    grad of the input."""

    forward: Callable[[torch.Tensor], torch.Tensor]
    backward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)


ACTIVATIONS: dict[str, Activation] = {
    "silu": Activation(F.silu, torch.ops.aten.silu_backward),
    "gelu_pytorch_tanh": Activation(partial(F.gelu, approximate="tanh"),
                                    partial(torch.ops.aten.gelu_backward, approximate="tanh")),
}


class UnsupportedConfigError(MebpError, ValueError):
    """The config asks for a feature (RoPE type, activation...) this engine does not implement."""


@dataclass(frozen=True)
class RopeSpec:
    """One layer type's rotary embedding, as in HF ``rope_parameters``."""

    rope_type: str = "default"
    rope_theta: float = 10_000.0
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @classmethod
    def from_params(
        cls, params: Mapping[str, Any], *, default_theta: float, max_position_embeddings: int
    ) -> RopeSpec:
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in ("default", "linear", "llama3"):
            raise UnsupportedConfigError(f"rope type {rope_type!r} is not supported")
        return cls(
            rope_type=rope_type,
            rope_theta=float(params.get("rope_theta") or default_theta),
            factor=float(params.get("factor", 1.0)),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(
                params.get("original_max_position_embeddings", max_position_embeddings)
            ),
        )


def parse_rope(config: Mapping[str, Any], *, default_theta: float = 10_000.0) -> RopeSpec:
    """One RoPE for all layers: 5.x ``rope_parameters`` or 4.x ``rope_theta``+``rope_scaling``."""
    params = {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
    params.setdefault("rope_theta", config.get("rope_theta", default_theta))
    return RopeSpec.from_params(
        params,
        default_theta=default_theta,
        max_position_embeddings=config.get("max_position_embeddings", 2048),
    )


def parse_layer_types(config: Mapping[str, Any]) -> tuple[tuple[str, ...], int | None]:
    """Qwen-style layer types and window: sliding only when ``use_sliding_window`` is set."""
    num_layers = config["num_hidden_layers"]
    window = config.get("sliding_window") if config.get("use_sliding_window") else None
    if window is None:
        return (FULL_ATTENTION,) * num_layers, None
    layer_types = config.get("layer_types") or [
        SLIDING_ATTENTION if i >= config.get("max_window_layers", 28) else FULL_ATTENTION
        for i in range(num_layers)
    ]
    return tuple(layer_types), window


def compute_inv_freq(rope: RopeSpec, head_dim: int) -> torch.Tensor:
    """Inverse frequencies (head_dim // 2,) in float32, as HF's ROPE_INIT_FUNCTIONS."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float) / head_dim
    inv_freq = 1.0 / (rope.rope_theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return scale_llama3_inv_freq(inv_freq, rope)
    return inv_freq


def scale_llama3_inv_freq(inv_freq: torch.Tensor, rope: RopeSpec) -> torch.Tensor:
    old_context_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_context_len / rope.low_freq_factor
    high_freq_wavelen = old_context_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_context_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def compute_cos_sin(
    rope: RopeSpec, head_dim: int, seq_len: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (T, head_dim) for positions 0..T-1, computed in float32 then cast."""
    inv_freq = compute_inv_freq(rope, head_dim).to(device)
    positions = torch.arange(seq_len, device=device, dtype=torch.float)
    freqs = positions[:, None] * inv_freq[None, :]  # (T, head_dim // 2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, head_dim)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def make_sliding_mask(seq_len: int, window: int, device: torch.device) -> torch.Tensor:
    """(T, T) boolean keep-mask: causal and kv > q - window, HF's sliding_window_overlay."""
    q = torch.arange(seq_len, device=device)[:, None]
    kv = torch.arange(seq_len, device=device)[None, :]
    return (kv <= q) & (kv > q - window)


@dataclass(frozen=True)
class BlockContext:
    """Per-sequence-length tables shared by all blocks, keyed by layer type.

    ``masks[t]`` is None for plain causal attention (SDPA's fast ``is_causal`` path).
    ``matmul_dtype``, when set and wider than the activations, is what attention runs in.
    """

    cos_sin: dict[str, tuple[torch.Tensor, torch.Tensor]]  # each (T, head_dim)
    masks: dict[str, torch.Tensor | None]  # each (T, T) bool or None
    matmul_dtype: torch.dtype | None = None


def make_block_context(
    *,
    rope: Mapping[str, RopeSpec],
    sliding_window: int | None,
    head_dim: int,
    seq_len: int,
    device: torch.device,
    dtype: torch.dtype,
    matmul_dtype: torch.dtype | None = None,
) -> BlockContext:
    cos_sin = {
        layer_type: compute_cos_sin(spec, head_dim, seq_len, device, dtype)
        for layer_type, spec in rope.items()
    }
    masks: dict[str, torch.Tensor | None] = {FULL_ATTENTION: None, SLIDING_ATTENTION: None}
    if sliding_window is not None and seq_len > sliding_window:
        masks[SLIDING_ATTENTION] = make_sliding_mask(seq_len, sliding_window, device)
    return BlockContext(cos_sin=cos_sin, masks=masks, matmul_dtype=matmul_dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q (B, H, T, hd) and k (B, KV, T, hd) by the (T, hd) tables."""
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    scale: float,
    matmul_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Causal GQA attention: q (B, H, T, hd), k/v (B, KV, T, hd) -> (B, T, H * hd), in
    ``matmul_dtype`` if given and different from q's (the result is cast back)."""
    if matmul_dtype is None or matmul_dtype == q.dtype:
        out = _sdpa(q, k, v, mask, scale)
    else:
        out = _UpcastAttention.apply(q, k, v, mask, scale, matmul_dtype)
    return out.transpose(1, 2).flatten(2)


def _sdpa(q, k, v, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True
    )  # (B, H, T, hd)


class _UpcastAttention(torch.autograd.Function):
    """Attention computed in a wider dtype than its inputs: it saves only the narrow q, k, v
    and recomputes the wide attention in backward (the narrow copies are what memory holds)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale: float, dtype: torch.dtype) -> torch.Tensor:
        ctx.save_for_backward(q, k, v, mask)
        ctx.scale, ctx.dtype = scale, dtype
        return _sdpa(q.to(dtype), k.to(dtype), v.to(dtype), mask, scale).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, mask = ctx.saved_tensors
        wide = [t.to(ctx.dtype).requires_grad_(True) for t in (q, k, v)]
        with torch.enable_grad():
            out = _sdpa(*wide, mask, ctx.scale)
            # a scalar's backward: a tensor gradient would import sympy for its shape check
            grads = torch.autograd.grad(torch.sum(out * grad_out.to(ctx.dtype)), wide)
        return (*(g.to(t.dtype) for g, t in zip(grads, (q, k, v), strict=True)),
                None, None, None)


def split_heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(B, T, N * hd) -> (B, N, T, hd), the SDPA layout."""
    return x.unflatten(-1, (-1, head_dim)).transpose(1, 2)


class RMSNorm(nn.Module):
    """Llama/Qwen RMSNorm: normalize in float32, cast back, then scale by the weight."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        with upcast_kept_as_input(x, x32):
            x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        # HF multiplies in the weight's dtype; casting the weight keeps activations in x's dtype
        return self.weight.to(x.dtype) * x32.to(x.dtype)


def upcast_kept_as_input(x: torch.Tensor, upcast: torch.Tensor):
    """Where autograd would save ``upcast`` (``x.float()``, a 16-bit ``x``'s exact float32
    copy) for a backward, it keeps ``x`` instead and upcasts it again when the backward reads
    it: the same bits at half the bytes."""
    if upcast is x or not (torch.is_grad_enabled() and upcast.requires_grad):
        return contextlib.nullcontext()
    return remade_when_read(upcast, x.float, unchanged=x)


def get_activation(name: str) -> Activation:
    if name not in ACTIVATIONS:
        raise UnsupportedConfigError(f"activation {name!r} is not supported")
    return ACTIVATIONS[name]


def apply_softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    if cap is None:
        return logits
    return torch.tanh(logits / cap) * cap


class DecoderBlock(nn.Module):
    """A transformer block as its two residual parts: attention, which mixes tokens, and the
    MLP, which works on each token alone (so a backward may run it a few tokens at a time)."""

    def forward(self, h: torch.Tensor, ctx: BlockContext) -> torch.Tensor:
        return self.mlp_part(self.attention_part(h, ctx))

    def attention_part(self, h: torch.Tensor, ctx: BlockContext) -> torch.Tensor:
        raise NotImplementedError

    def mlp_part(self, h: torch.Tensor) -> torch.Tensor:
        """``h`` of any leading shape (..., D): no position depends on another."""
        return self.mlp_output(h, self.mlp(self.mlp_input(h)))

    def mlp_input(self, h: torch.Tensor) -> torch.Tensor:
        """What the MLP reads of the residual stream ``h`` (..., D)."""
        raise NotImplementedError

    def mlp_output(self, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The block's output from the residual stream ``h`` and the MLP's output ``y``."""
        raise NotImplementedError

    def residual_output_projection(self) -> nn.Module | None:
        """The projection whose output goes straight into the block's output sum, so that
        nothing in the block's backward reads it (a recompute for a backward may skip its
        product), or None if its output is read (e.g. normed before the sum)."""
        return None


class PreNormBlock(DecoderBlock):
    """Llama's block (Qwen2/2.5/3, SmolLM2): RMSNorm before attention and before the MLP."""

    self_attn: nn.Module
    mlp: nn.Module
    input_layernorm: nn.Module
    post_attention_layernorm: nn.Module

    def attention_part(self, h: torch.Tensor, ctx: BlockContext) -> torch.Tensor:
        return h + self.self_attn(self.input_layernorm(h), ctx)  # (B, T, D)

    def mlp_input(self, h: torch.Tensor) -> torch.Tensor:
        return self.post_attention_layernorm(h)

    def mlp_output(self, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return h + y

    def residual_output_projection(self) -> nn.Module:
        return self.mlp.down_proj  # h + down(...): the sum's backward never reads it


class CausalLM(nn.Module):
    """The engine-facing surface every architecture's ``Model`` shares.

    Subclasses set ``self.args``, ``self.model`` (embed_tokens, layers, norm) and, when the head
    is untied, ``self.lm_head``; they override ``embed``/``make_context`` when they differ.
    """

    args: Any
    model: nn.Module

    @property
    def layers(self) -> nn.ModuleList:
        return self.model.layers

    @property
    def head_weight_name(self) -> str:
        if self.args.tie_word_embeddings:
            return "model.embed_tokens.weight"
        return "lm_head.weight"

    @property
    def logit_softcap(self) -> float | None:
        return None

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)  # (B, T, D)

    def make_context(
        self,
        seq_len: int,
        device: torch.device,
        dtype: torch.dtype,
        matmul_dtype: torch.dtype | None = None,
    ) -> BlockContext:
        return make_block_context(
            rope=self.args.rope,
            sliding_window=self.args.sliding_window,
            head_dim=self.args.head_dim,
            seq_len=seq_len,
            device=device,
            dtype=dtype,
            matmul_dtype=matmul_dtype,
        )

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.norm(h)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Reference full forward: logits (B, T, V)."""
        h = self.embed(input_ids)
        ctx = self.make_context(input_ids.shape[1], h.device, h.dtype)
        for layer in self.model.layers:
            h = layer(h, ctx)
        h = self.final_norm(h)
        if self.args.tie_word_embeddings:
            logits = F.linear(h, self.model.embed_tokens.weight)
        else:
            logits = self.lm_head(h)
        return apply_softcap(logits, self.logit_softcap)
