"""The store format's dtype names (``format.ITEMSIZES``) as torch dtypes."""

from __future__ import annotations

import torch

from mebp_core.store.format import ITEMSIZES

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in ITEMSIZES}
