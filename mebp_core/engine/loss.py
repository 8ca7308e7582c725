"""Cross-entropy through the output projection without ever holding [tokens x vocab] logits.

One pass over vocabulary tiles keeps, per token, the running max ``m``, the running sum
``s = sum exp(l - m)`` and the running ``acc = sum exp(l - m) * dl/dz * W_v``. At the end
``loss = m + log s - l_target`` and ``dloss/dh = acc / s - dl/dz_target * W_target``: the loss
and its gradient come out of one decompression of the head, with nothing kept for a backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mebp_core.engine.frozen import WeightWorkingSet

IGNORE_INDEX = -100


@dataclass
class HeadLoss:
    loss_sum: torch.Tensor  # () float32, summed over valid tokens
    valid_tokens: int
    correct_tokens: int
    grad_hidden: torch.Tensor | None  # (N, D) d loss_sum / d hidden, float32


def compute_head_loss(hidden: torch.Tensor, targets: torch.Tensor, *, store, head_name: str,
                      dtype: torch.dtype, tile_bytes: int, softcap: float | None = None,
                      working_set: WeightWorkingSet, with_grad: bool = True) -> HeadLoss:
    """Sum of token cross-entropies of ``hidden @ W_head^T`` against ``targets``.

    hidden (N, D) final-normed states; targets (N,) next-token ids or IGNORE_INDEX.
    """
    valid = targets != IGNORE_INDEX
    n_valid = int(valid.sum())
    n_tokens, dim = hidden.shape
    if n_valid == 0:
        grad = torch.zeros(n_tokens, dim) if with_grad else None
        return HeadLoss(torch.zeros(()), 0, 0, grad)
    h = hidden[valid].to(dtype)  # (n, D)
    tgt = targets[valid]
    vocab = store.info(head_name).shape[0]
    row_bytes = dim * torch.empty((), dtype=dtype).element_size()
    tile_rows = max(1, min(vocab, tile_bytes // row_bytes))

    run_max = torch.full((n_valid,), float("-inf"))
    run_sum = torch.zeros(n_valid)
    acc = torch.zeros(n_valid, dim) if with_grad else None
    target_logit = torch.zeros(n_valid)
    best_logit = torch.full((n_valid,), float("-inf"))
    best_index = torch.zeros(n_valid, dtype=torch.long)
    for start in range(0, vocab, tile_rows):
        stop = min(start + tile_rows, vocab)
        weight = working_set.decompress(store, head_name, dtype, rows=slice(start, stop))
        raw = (h @ weight.T).float()  # (n, V_t)
        logits = softcap * torch.tanh(raw / softcap) if softcap else raw
        tile_max, tile_arg = logits.max(dim=1)
        better = tile_max > best_logit
        best_logit = torch.where(better, tile_max, best_logit)
        best_index = torch.where(better, tile_arg + start, best_index)
        in_tile = (tgt >= start) & (tgt < stop)
        local = (tgt - start).clamp(0, stop - start - 1)
        target_logit += torch.where(in_tile, logits.gather(1, local[:, None])[:, 0], 0.0)

        new_max = torch.maximum(run_max, tile_max)
        rescale = torch.exp(run_max - new_max)
        probs = torch.exp(logits - new_max[:, None])  # unnormalized, (n, V_t)
        run_sum = run_sum * rescale + probs.sum(dim=1)
        if with_grad:
            if softcap:
                probs *= 1 - (logits / softcap) ** 2
            acc.mul_(rescale[:, None]).add_((probs.to(dtype) @ weight).float())
        run_max = new_max
        working_set.drop(weight)
        del weight, raw, logits, probs

    losses = run_max + torch.log(run_sum) - target_logit
    correct = int((best_index == tgt).sum())
    grad = None
    if with_grad:
        target_rows = store.gather_rows(head_name, tgt, dtype).float()  # (n, D)
        if softcap:
            target_rows *= (1 - (target_logit / softcap) ** 2)[:, None]
        grad = torch.zeros(n_tokens, dim)
        grad[valid] = acc / run_sum[:, None] - target_rows
    return HeadLoss(losses.sum(), n_valid, correct, grad)

