from __future__ import annotations

import struct

import pytest
import torch

from mebp_core.kernel_memory import read_memory
from mebp_core.store.dtypes import DTYPES
from mebp_core.store.errors import StoreError, StoreFormatError
from mebp_core.store.format import ITEMSIZES, MAGIC, STORE_FILENAME
from mebp_core.store.pack import pack_model
from mebp_core.store.reader import open_store


@pytest.fixture(scope="module")
def packed_tiny(tmp_path_factory, hf_models):
    src, _ = hf_models("qwen2")
    return pack_model(src, tmp_path_factory.mktemp("packed") / "tiny", quant="int4")


def copy_store(packed, tmp_path):
    out = tmp_path / "copy"
    out.mkdir()
    for f in packed.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    return out


def test_refuses_unknown_version(packed_tiny, tmp_path):
    store_dir = copy_store(packed_tiny, tmp_path)
    blob = bytearray((store_dir / STORE_FILENAME).read_bytes())
    blob[8:12] = struct.pack("<I", 2)
    (store_dir / STORE_FILENAME).write_bytes(bytes(blob))
    with pytest.raises(StoreFormatError, match=r"model\.mebp.*version 2"):
        open_store(store_dir)


def test_refuses_wrong_magic(packed_tiny, tmp_path):
    store_dir = copy_store(packed_tiny, tmp_path)
    blob = bytearray((store_dir / STORE_FILENAME).read_bytes())
    assert bytes(blob[:8]) == MAGIC
    blob[:8] = b"GGUFxxxx"
    (store_dir / STORE_FILENAME).write_bytes(bytes(blob))
    with pytest.raises(StoreFormatError, match=r"model\.mebp.*not a mebp store"):
        open_store(store_dir)


@pytest.mark.parametrize("keep_bytes", [10, 200, -1])
def test_refuses_truncated_file(packed_tiny, tmp_path, keep_bytes):
    store_dir = copy_store(packed_tiny, tmp_path)
    blob = (store_dir / STORE_FILENAME).read_bytes()
    (store_dir / STORE_FILENAME).write_bytes(blob[:keep_bytes])
    with pytest.raises(StoreFormatError, match=r"model\.mebp.*truncated"):
        open_store(store_dir)


def test_missing_tensor_is_named(packed_tiny):
    with open_store(packed_tiny) as store, pytest.raises(StoreError, match="no_such.weight"):
        store.dequantize("model.no_such.weight")


def test_arrays_are_64_byte_aligned_views_of_the_mapping(packed_tiny):
    with open_store(packed_tiny) as store:
        base = store._bytes.data_ptr()
        end = base + store._bytes.numel()
        for name in store.names():
            raw = store.raw(name)
            for t in (raw.data, raw.scales, raw.biases):
                if t is not None:
                    assert base <= t.data_ptr() < end and (t.data_ptr() - base) % 64 == 0


def test_gather_rows_equals_rows_of_full_dequantization(packed_tiny):
    with open_store(packed_tiny) as store:
        name = "model.embed_tokens.weight"
        assert store.info(name).bits == 4
        full = store.dequantize(name, torch.float32)
        index = torch.tensor([[3, 95, 0], [3, 17, 42]])
        rows = store.gather_rows(name, index, torch.float32)
        assert rows.shape == (2, 3, 64)
        assert torch.equal(rows, full[index])
        bias = "model.layers.0.self_attn.q_proj.bias"  # unquantized 1-D
        assert store.info(bias).bits is None
        assert torch.equal(store.dequantize(bias, rows=slice(2, 5)), store.raw(bias).data[2:5])


def test_tile_dequantization_returns_only_the_rows_asked_for(packed_tiny):
    with open_store(packed_tiny) as store:
        name = "model.layers.1.mlp.down_proj.weight"
        full = store.dequantize(name, torch.bfloat16)
        tile = store.dequantize(name, torch.bfloat16, rows=slice(8, 24))
        assert tile.shape == (16, 128) and torch.equal(tile, full[8:24])
        out = torch.empty(16, 128, dtype=torch.bfloat16)
        assert store.dequantize(name, torch.bfloat16, rows=slice(8, 24), out=out) is out


def test_opening_and_reading_a_big_store_copies_nothing(tmp_path, store_helpers):
    src = tmp_path / "src"
    # ~44 MB of float32 weights, stored unquantized so the file is tens of MB
    config = store_helpers.tiny_config(
        "llama", vocab_size=40000, hidden_size=128, num_hidden_layers=1
    )
    from transformers import AutoConfig, AutoModelForCausalLM

    AutoModelForCausalLM.from_config(AutoConfig.for_model(**config)).save_pretrained(src)
    packed = pack_model(src, tmp_path / "packed", quant="none")
    file_mb = (packed / STORE_FILENAME).stat().st_size / 2**20
    assert file_mb > 30
    before_kb = store_helpers.rss_anon_kb()
    before_file = read_memory().file_bytes
    store = open_store(packed)
    tensors = [store.raw(name).data for name in store.names()]
    sum(float(t.sum()) for t in tensors)  # reads every page
    grown_mb = (store_helpers.rss_anon_kb() - before_kb) / 1024
    file_grown_mb = (read_memory().file_bytes - before_file) / 2**20
    assert file_grown_mb > 0.9 * file_mb  # every page was read, as a clean file page
    assert grown_mb < 4, f"anonymous memory grew {grown_mb:.1f} MB for a {file_mb:.0f} MB store"
    store.close()


def test_views_outlive_the_store_and_a_closed_store_refuses(packed_tiny):
    """Closing never unmaps what a view still reads (touching it after close once crashed
    the process); the store itself refuses to be used again. Run in a child process, so a
    use-after-unmap fails this test instead of killing pytest."""
    code = (
        "import sys, torch\n"
        "from mebp_core.store.errors import StoreError\n"
        "from mebp_core.store.reader import open_store\n"
        "store = open_store(sys.argv[1])\n"
        "name = next(n for n in store.names() if store.info(n).bits)\n"
        "raw = store.raw(name)\n"
        "before = raw.data.double().sum().item()\n"
        "store.close()\n"
        "import gc; gc.collect()\n"
        "after = raw.data.double().sum().item()\n"
        "try:\n"
        "    store.raw(name)\n"
        "except StoreError as exc:\n"
        "    print('refused:', exc)\n"
        "print(before == after)\n"
    )
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code, str(packed_tiny)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-1000:]}"
    assert "refused:" in done.stdout and "store is closed" in done.stdout
    assert done.stdout.strip().endswith("True")


@pytest.mark.parametrize("quant", ["int4", "none"])
def test_float32_tiles_hold_bfloat16s_values_when_asked(tmp_path, hf_models, quant):
    """A lazy float32 tile of a bf16 model (rows, columns, into a buffer, or whole) holds
    what the bf16 weight holds, packed or unquantized (whose float32 weights round)."""
    src, _ = hf_models("qwen2")
    store = open_store(pack_model(src, tmp_path / quant, quant=quant))
    name = "model.layers.0.mlp.down_proj.weight"
    held = store.dequantize(name, torch.bfloat16).float()
    assert not torch.equal(store.dequantize(name, torch.float32), held)  # it rounds here
    assert torch.equal(store.dequantize(name, torch.float32, values=torch.bfloat16), held)
    assert torch.equal(store.dequantize(name, torch.float32, rows=slice(3, 9),
                                        values=torch.bfloat16), held[3:9])
    cols = slice(32, 64)  # a whole quantization group: the packed columns' path
    assert torch.equal(store.dequantize(name, torch.float32, cols=cols, values=torch.bfloat16),
                       held[:, cols])
    out = torch.empty(held.shape)
    store.dequantize(name, torch.float32, out=out, values=torch.bfloat16)
    assert torch.equal(out, held)


def test_the_formats_item_sizes_are_torchs():
    assert {name: torch.empty((), dtype=dtype).element_size() for name, dtype in DTYPES.items()
            } == ITEMSIZES
