"""``LoraLinear`` and ``apply_lora``: put LoRA branches on a module tree with HF names.

A and B live in submodules ``lora_A`` / ``lora_B`` with a ``.weight`` each, like PEFT, so the
adapter key of a module at ``path`` is ``base_model.model.<path>.lora_A.weight`` with no key
map. They are float32 master weights whatever dtype the base computes in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from mebp_core.errors import MebpError
from mebp_core.lora.function import lora_delta
from mebp_core.lora.init import init_lora_weights
from mebp_core.lora.peft_io import check_adapter_fits
from mebp_core.lora.spec import LoraSpec


class LoraTargetError(MebpError, ValueError):
    """The model has no module a spec targets, or a target is not a linear projection."""


class LoraWeight(nn.Module):
    """Holds one LoRA matrix as ``.weight`` (mirrors PEFT's ``lora_A``/``lora_B`` Linear)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.to(torch.float32).contiguous())


class LoraLinear(nn.Module):
    """``base(x) + (x A^T) B^T * scaling`` with the MeSP backward for the branch."""

    def __init__(
        self,
        base: Callable[[torch.Tensor], torch.Tensor],
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        scaling: float,
    ) -> None:
        super().__init__()
        self.base = base
        self.lora_A = LoraWeight(lora_a)  # (r, in)
        self.lora_B = LoraWeight(lora_b)  # (out, r)
        self.scaling = float(scaling)
        self.store_hidden = False  # keep h = x A^T for backward instead of recomputing it
        self.matmul_dtype: torch.dtype | None = None  # None: the input's dtype
        self.in_features = lora_a.shape[1]
        self.out_features = lora_b.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.delta(x)  # (..., out)

    def delta(self, x: torch.Tensor, rows: slice | None = None,
              cols: slice | None = None) -> torch.Tensor:
        """The branch's output rows ``rows`` (B's rows) for x (..., in), or (``cols``) its
        whole output from input columns ``cols`` alone (A's columns) for x (..., |cols|)."""
        lora_a = self.lora_A.weight if cols is None else self.lora_A.weight[:, cols]
        lora_b = self.lora_B.weight if rows is None else self.lora_B.weight[rows]
        return lora_delta(x, lora_a, lora_b, self.scaling, self.store_hidden,
                          self.matmul_dtype)


def read_features(module: object, path: str) -> tuple[int, int]:
    """``(in_features, out_features)`` of a projection, from attributes or its weight."""
    if hasattr(module, "in_features") and hasattr(module, "out_features"):
        return int(module.in_features), int(module.out_features)
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return int(weight.shape[1]), int(weight.shape[0])
    raise LoraTargetError(f"{path}: cannot adapt {type(module).__name__}, it has no in/out size")


def apply_lora(model: nn.Module, spec: LoraSpec, seed: int) -> dict[str, LoraLinear]:
    """Replace the targeted modules of ``model`` in place; return the wrappers by path.

    Targets are found with ``named_modules``, so a base must be an ``nn.Module`` with
    ``in_features``/``out_features`` or a 2-D ``weight``. Like PEFT's ``get_peft_model``,
    every parameter the model had before is frozen.
    """
    named = dict(model.named_modules())
    paths = spec.target_module_paths(named)
    if not paths:
        raise LoraTargetError(f"no module ends with any of {list(spec.module_suffixes())}")
    for param in model.parameters():
        param.requires_grad_(False)
    adapted: dict[str, LoraLinear] = {}
    for path in paths:
        base = named[path]
        if isinstance(base, LoraLinear):
            raise LoraTargetError(f"{path} already carries a LoRA branch")
        in_features, out_features = read_features(base, path)
        lora_a, lora_b = init_lora_weights(
            spec.rank, in_features, out_features, seed=seed, path=path
        )
        wrapper = LoraLinear(base, lora_a, lora_b, spec.scaling)
        parent_path, _, child = path.rpartition(".")
        setattr(model.get_submodule(parent_path), child, wrapper)
        adapted[path] = wrapper
    return adapted


def lora_parameters(adapted: Mapping[str, LoraLinear]) -> list[nn.Parameter]:
    """The trainable parameters, A then B per module, in path order."""
    return [
        p for path in adapted for p in (adapted[path].lora_A.weight, adapted[path].lora_B.weight)
    ]


def collect_lora_tensors(
    adapted: Mapping[str, LoraLinear],
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Detached ``{path: (A, B)}`` for :func:`mebp_core.lora.peft_io.save_peft_adapter`."""
    return {
        path: (module.lora_A.weight.detach(), module.lora_B.weight.detach())
        for path, module in adapted.items()
    }


def assign_lora_tensors(
    adapted: Mapping[str, LoraLinear], adapters: Mapping[str, tuple[torch.Tensor, torch.Tensor]]
) -> None:
    """Copy loaded ``{path: (A, B)}`` into the wrappers (e.g. ``--init-adapter``).

    Raises ``AdapterError`` naming the module if an adapter is missing from the model or
    does not fit it; nothing is copied then.
    """
    shapes = {path: (m.out_features, m.in_features) for path, m in adapted.items()}
    check_adapter_fits(adapters, shapes)
    for path, (lora_a, lora_b) in adapters.items():
        with torch.no_grad():
            adapted[path].lora_A.weight.copy_(lora_a)
            adapted[path].lora_B.weight.copy_(lora_b)
