"""LoRA with PEFT's semantics, the MeSP backward, and PEFT adapter I/O."""

from __future__ import annotations

from mebp_core.lora.function import lora_delta
from mebp_core.lora.init import init_lora_weights
from mebp_core.lora.linear import (
    LoraLinear,
    LoraTargetError,
    apply_lora,
    assign_lora_tensors,
    collect_lora_tensors,
    lora_parameters,
)
from mebp_core.lora.peft_io import (
    AdapterError,
    check_adapter_fits,
    load_peft_adapter,
    save_peft_adapter,
)
from mebp_core.lora.spec import LoraSpec

__all__ = [
    "AdapterError",
    "LoraLinear",
    "LoraSpec",
    "LoraTargetError",
    "apply_lora",
    "assign_lora_tensors",
    "check_adapter_fits",
    "collect_lora_tensors",
    "init_lora_weights",
    "load_peft_adapter",
    "lora_delta",
    "lora_parameters",
    "save_peft_adapter",
]
