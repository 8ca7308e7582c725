"""Adapters of identical tensors are identical bytes, whichever process writes them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

SAVE_ADAPTER = """
import hashlib, sys, torch
from mebp_core.lora.peft_io import save_peft_adapter
from mebp_core.lora.spec import LoraSpec
gen = torch.Generator().manual_seed(0)
tensors = {f"model.layers.{i}.self_attn.{p}": (torch.randn(4, 16, generator=gen),
                                               torch.randn(16, 4, generator=gen))
           for i in range(2) for p in ("q_proj", "v_proj")}
save_peft_adapter(sys.argv[1], tensors, LoraSpec(rank=4, alpha=8, targets="all"),
                  "preset:tiny", model_type="llama")
"""


def test_identical_adapters_are_identical_bytes(tmp_path):
    """safetensors writes its metadata in a per-process hash order: each save runs in a
    process of its own, as jobs do."""
    digests = set()
    for index in range(6):
        out = tmp_path / f"adapter-{index}"
        subprocess.run([sys.executable, "-c", SAVE_ADAPTER, str(out)], check=True)
        digests.add(hashlib.sha256((out / "adapter_model.safetensors").read_bytes())
                    .hexdigest())
        header_length = int.from_bytes((out / "adapter_model.safetensors").read_bytes()[:8],
                                       "little")
        header = (out / "adapter_model.safetensors").read_bytes()[8:8 + header_length]
        keys = list(json.loads(header)["__metadata__"])
        assert keys == sorted(keys)
    assert len(digests) == 1
