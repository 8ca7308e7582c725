"""How far an exported GGUF base's weights are from the packed ones the adapter was trained
against: each tensor as llama.cpp dequantizes it (gguf's reader, bit for bit ggml's) against
the engine's float32 dequantization, in llama.cpp's row order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from mebp_core.store.export_base_checks import check_gguf_base
from mebp_core.store.export_base_gguf import gguf_tensor_plan
from mebp_core.store.reader import PackedStore
from mebp_core.store.shapes import full_text_config


@dataclass(frozen=True)
class TensorError:
    name: str  # the GGUF tensor's
    block_type: str  # ggml's name of its type: Q4_1, Q8_0, F32
    max_abs_error: float
    max_abs_weight: float
    sum_squared_error: float
    sum_squared_weight: float
    elements: int

    @property
    def relative_error(self) -> float:
        """The largest error over the largest weight of the tensor."""
        return self.max_abs_error / self.max_abs_weight if self.max_abs_weight else 0.0

    @property
    def rms_relative_error(self) -> float:
        return float(np.sqrt(self.sum_squared_error / self.sum_squared_weight)) \
            if self.sum_squared_weight else 0.0


def gguf_base_errors(path: Path, store: PackedStore) -> list[TensorError]:
    """One ``TensorError`` per tensor the store holds, in the file's order."""
    config = full_text_config(store.config)
    arch = check_gguf_base(store.config, "float32")
    want = {name: load for name, load, *_ in gguf_tensor_plan(store, arch, config, np.float32)}
    errors = []
    for tensor in gguf.GGUFReader(path).tensors:
        if tensor.name not in want:
            continue
        got = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float64)
        ours = want[tensor.name]().numpy().astype(np.float64).reshape(got.shape)
        diff = got - ours
        errors.append(TensorError(tensor.name, tensor.tensor_type.name,
                                  float(np.abs(diff).max()), float(np.abs(ours).max()),
                                  float((diff * diff).sum()), float((ours * ours).sum()),
                                  ours.size))
    return errors


def overall_error(name: str, errors: list[TensorError]) -> TensorError:
    """The tensors taken together: the largest error over the largest weight of any."""
    return TensorError(name, "/".join(sorted({e.block_type for e in errors})),
                       max(e.max_abs_error for e in errors),
                       max(e.max_abs_weight for e in errors),
                       sum(e.sum_squared_error for e in errors),
                       sum(e.sum_squared_weight for e in errors),
                       sum(e.elements for e in errors))
