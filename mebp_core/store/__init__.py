"""The packed weight store: quantization, the ``model.mebp`` format, packing, mmap reading.

The store owns the bytes; the engine asks for tensors by their Hugging Face name.
"""

from __future__ import annotations

from mebp_core.store.errors import PackError, QuantizationError, StoreError, StoreFormatError
from mebp_core.store.format import FORMAT_VERSION, STORE_FILENAME
from mebp_core.store.pack import pack_model
from mebp_core.store.presets import (
    iter_preset_tensors,
    list_presets,
    preset_config,
    preset_parameter_count,
    save_preset_as_hf,
)
from mebp_core.store.quant import QuantizedTensor, dequantize, quantize
from mebp_core.store.reader import PackedStore, TensorInfo, open_store
from mebp_core.store.resolve import resolve_model

__all__ = [
    "FORMAT_VERSION",
    "STORE_FILENAME",
    "PackError",
    "PackedStore",
    "QuantizationError",
    "QuantizedTensor",
    "StoreError",
    "StoreFormatError",
    "TensorInfo",
    "dequantize",
    "iter_preset_tensors",
    "list_presets",
    "open_store",
    "pack_model",
    "preset_config",
    "preset_parameter_count",
    "quantize",
    "resolve_model",
    "save_preset_as_hf",
]
