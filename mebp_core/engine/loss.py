"""Cross-entropy through the output projection without ever holding [tokens x vocab] logits
(and, for plain backprop, with them).

One pass over vocabulary tiles keeps, per token, the running max ``m``, the running sum
``s = sum exp(l - m)`` and the running ``acc = sum exp(l - m) * dl/dz * W_v``. At the end
``loss = m + log s - l_target`` and ``dloss/dh = acc / s - dl/dz_target * W_target``: the loss
and its gradient come out of one decompression of the head, with nothing kept for a backward.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mebp_core.data.example import IGNORE_INDEX
from mebp_core.engine.frozen import WeightWorkingSet
from mebp_core.models.base import apply_softcap


@dataclass
class HeadLoss:
    loss_sum: torch.Tensor  # () float32, summed over valid tokens
    valid_tokens: int
    correct_tokens: int
    grad_hidden: torch.Tensor | None  # (N, D) d loss_sum / d hidden, float32


class _OnlineSoftmax:
    """Per-token running max, sum of exponentials, argmax, target logit and (optionally)
    ``sum_v exp(l_v - max) * dl_v/dz_v * W_v``, fed one vocabulary tile at a time."""

    def __init__(self, targets: torch.Tensor, dim: int, softcap: float | None,
                 with_grad: bool) -> None:
        n = targets.shape[0]
        self.targets, self.softcap = targets, softcap
        self.run_max = torch.full((n,), float("-inf"))
        self.run_sum = torch.zeros(n)
        self.target_logit = torch.zeros(n)
        self.best_logit = torch.full((n,), float("-inf"))
        self.best_index = torch.zeros(n, dtype=torch.long)
        self.acc = torch.zeros(n, dim) if with_grad else None

    def add_tile(self, logits: torch.Tensor, weight: torch.Tensor, start: int,
                 cast: torch.Tensor | None) -> None:
        """logits (n, V_t) float32 raw logits of vocabulary rows start..start+V_t, overwritten
        here (softcapped, then turned into probabilities); weight those rows; cast an (n, V_t)
        buffer in the weight's dtype when that is not float32."""
        cap = self.softcap
        if cap:  # apply_softcap, in place
            logits.div_(cap).tanh_().mul_(cap)
        stop = start + logits.shape[1]
        tile_max, tile_arg = logits.max(dim=1)
        better = tile_max > self.best_logit
        self.best_logit = torch.where(better, tile_max, self.best_logit)
        self.best_index = torch.where(better, tile_arg + start, self.best_index)
        in_tile = (self.targets >= start) & (self.targets < stop)
        local = (self.targets - start).clamp(0, stop - start - 1)
        self.target_logit += torch.where(in_tile, logits.gather(1, local[:, None])[:, 0], 0.0)

        new_max = torch.maximum(self.run_max, tile_max)
        rescale = torch.exp(self.run_max - new_max)
        slope = None
        if cap and self.acc is not None:
            slope = (logits / cap).pow_(2).neg_().add_(1)  # d softcap(z) / dz
        probs = logits.sub_(new_max[:, None]).exp_()  # unnormalized, (n, V_t)
        self.run_sum = self.run_sum * rescale + probs.sum(dim=1)
        if self.acc is not None:
            if slope is not None:
                probs *= slope
            if cast is not None:
                probs = cast.copy_(probs)
            self.acc.mul_(rescale[:, None]).add_((probs @ weight).float())
        self.run_max = new_max

    def losses(self) -> torch.Tensor:
        return self.run_max + torch.log(self.run_sum) - self.target_logit  # (n,)

    def gradient(self, target_rows: torch.Tensor) -> torch.Tensor:
        """d loss / d hidden: softmax-weighted rows minus the (softcap-scaled) target rows."""
        if self.softcap:
            target_rows = target_rows * (1 - (self.target_logit / self.softcap) ** 2)[:, None]
        return self.acc / self.run_sum[:, None] - target_rows


class _TileBuffers:
    """One vocabulary tile's float32 logits and, when the matmuls run in 16 bits, their 16-bit
    twin, allocated for the first (largest) tile and reused by every later one: the loss
    holds these few bytes per token and vocabulary row, and the heap never sees a tile's
    temporaries come and go."""

    def __init__(self, n_tokens: int, dtype: torch.dtype) -> None:
        self.n_tokens, self.dtype = n_tokens, dtype
        self.float32: torch.Tensor | None = None
        self.low: torch.Tensor | None = None

    def logits(self, h: torch.Tensor, weight: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``h @ weight.T`` in float32 (computed in ``h``'s dtype), and the 16-bit buffer."""
        shape = (self.n_tokens, weight.shape[0])
        numel = shape[0] * shape[1]
        if self.float32 is None:
            self.float32 = torch.empty(numel)
            if self.dtype != torch.float32:
                self.low = torch.empty(numel, dtype=self.dtype)
        logits = self.float32[:numel].view(shape)
        if self.low is None:
            return torch.mm(h, weight.T, out=logits), None
        low = self.low[:numel].view(shape)
        return logits.copy_(torch.mm(h, weight.T, out=low)), low


def compute_head_loss(hidden: torch.Tensor, targets: torch.Tensor, *, store, head_name: str,
                      dtype: torch.dtype, tile_bytes: int, softcap: float | None = None,
                      working_set: WeightWorkingSet, with_grad: bool = True) -> HeadLoss:
    """Sum of token cross-entropies of ``hidden @ W_head^T`` against ``targets``.

    hidden (N, D) final-normed states; targets (N,) next-token ids or IGNORE_INDEX; ``dtype``
    is what the matmuls run in (the hidden states are cast to it).
    """
    valid = targets != IGNORE_INDEX
    n_valid = int(valid.sum())
    n_tokens, dim = hidden.shape
    if n_valid == 0:
        grad = torch.zeros(n_tokens, dim) if with_grad else None
        return HeadLoss(torch.zeros(()), 0, 0, grad)
    h = hidden[valid].to(dtype)  # (n, D)
    tgt = targets[valid]
    state = _OnlineSoftmax(tgt, dim, softcap, with_grad)
    buffers = _TileBuffers(h.shape[0], dtype)
    for start, weight in iter_vocab_tiles(store, head_name, dtype, tile_bytes, working_set):
        logits, cast = buffers.logits(h, weight)
        state.add_tile(logits, weight, start, cast)
    grad = None
    if with_grad:
        grad = torch.zeros(n_tokens, dim)
        # the target rows as the model holds them (the tiles' values, when they are wider)
        rows = store.gather_rows(head_name, tgt, working_set.weight_values or dtype)
        grad[valid] = state.gradient(rows.float())
    correct = int((state.best_index == tgt).sum())
    return HeadLoss(state.losses().sum(), n_valid, correct, grad)


def iter_vocab_tiles(store, head_name: str, dtype: torch.dtype, tile_bytes: int,
                     working_set: WeightWorkingSet) -> Iterator[tuple[int, torch.Tensor]]:
    """(first row, rows) of the output projection in ``dtype``, one bounded tile at a time;
    each tile is released when the next is asked for (a resident head is sliced, not copied,
    unless it must be cast)."""
    vocab, dim = store.info(head_name).shape
    tile_rows = max(1, min(vocab, tile_bytes // (dim * dtype.itemsize)))
    resident = working_set.resident.get(head_name)
    for start in range(0, vocab, tile_rows):
        rows = slice(start, min(start + tile_rows, vocab))
        if resident is not None and resident.dtype == dtype:
            yield start, resident[rows]
            continue
        if resident is not None:
            weight = working_set.upcast(resident[rows], dtype)
        else:
            weight = working_set.decompress(store, head_name, dtype, rows=rows)
        try:
            yield start, weight
        finally:
            working_set.drop(weight)


def compute_full_logits_loss(hidden: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor,
                             softcap: float | None) -> tuple[torch.Tensor, int, int]:
    """Summed token cross-entropy, valid and correct target counts, from the full (N, V)
    logits of ``hidden`` (N, D) and the head ``weight`` (V, D), under autograd: what a plain
    PyTorch trainer computes."""
    logits = apply_softcap((hidden @ weight.T).float(), softcap)  # (N, V)
    loss_sum = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")
    valid = targets != IGNORE_INDEX
    correct = int((logits.detach().argmax(dim=1) == targets)[valid].sum())
    return loss_sum, int(valid.sum()), correct
