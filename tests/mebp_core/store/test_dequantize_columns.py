"""Columns of a packed weight dequantize to the same values as the whole weight, sliced."""

from __future__ import annotations

import pytest
import torch

from mebp_core.store.native import set_native_enabled
from mebp_core.store.quant import dequantize, quantize

COLUMN_SLICES = [slice(0, 64), slice(64, 192), slice(128, 256), slice(0, 256),
                 slice(40, 100), slice(3, 5), slice(250, 256)]  # the last three unaligned


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group_size", [32, 64, 128])  # 128: wider than a 64-column chunk
@pytest.mark.parametrize("bits", [4, 8])
def test_columns_equal_the_whole_tensor_sliced(bits, group_size, dtype, native):
    weight = torch.randn(24, 256, generator=torch.Generator().manual_seed(0))
    packed = quantize(weight, bits=bits, group_size=group_size)
    args = (packed.data, packed.scales, packed.biases, bits, group_size, dtype)
    set_native_enabled(native)
    try:
        whole = dequantize(*args)
        for cols in COLUMN_SLICES:
            expected = whole[:, cols]
            assert torch.equal(dequantize(*args, cols=cols), expected), cols
            out = torch.empty(24, cols.stop - cols.start, dtype=dtype)
            assert dequantize(*args, cols=cols, out=out) is out
            assert torch.equal(out, expected), cols
            rows = slice(5, 17)
            assert torch.equal(dequantize(*args, rows=rows, cols=cols), whole[rows, cols])
    finally:
        set_native_enabled(True)


def test_the_store_slices_packed_and_plain_tensors_by_column(hf_models, tmp_path):
    from mebp_core.store.pack import pack_model
    from mebp_core.store.reader import open_store

    hf_dir, _ = hf_models("llama")
    for quant in ("none", "int4", "int8"):
        store = open_store(pack_model(hf_dir, tmp_path / quant, quant=quant, group_size=32))
        name = "model.layers.0.mlp.down_proj.weight"
        n_rows, k = store.info(name).shape
        whole = store.dequantize(name)
        for cols in (slice(0, 32), slice(32, k), slice(10, k - 7)):
            assert torch.equal(store.dequantize(name, cols=cols), whole[:, cols])
            assert torch.equal(store.dequantize(name, rows=slice(1, n_rows - 1), cols=cols),
                               whole[1 : n_rows - 1, cols])
