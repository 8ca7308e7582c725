"""Direct reads (``store_reads="direct"``): the same bytes, so the same weights and gradients
bit for bit as through the mapping; the next block read ahead; nothing left in the page
cache."""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import subprocess

import pytest
import torch
import transformers
from engine_fixtures import load_with_random_lora, random_batch
from test_exactness import engine_gradients, write_random_adapter

from mebp_core.config import EngineKnobs
from mebp_core.engine import mezo
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.store_reads import staging_bytes
from mebp_core.plan.workload import Workload
from mebp_core.resident import block_index
from mebp_core.store.direct import DirectReadStore, open_direct_store
from mebp_core.store.errors import StoreError
from mebp_core.store.format import STORE_FILENAME
from mebp_core.store.pack import pack_model
from mebp_core.store.reader import open_store
from mebp_core.store.staging import MIN_ROWS_BYTES

SETTINGS = {
    "defaults": {},
    "every-2-unshared-small-tiles": dict(checkpoint_blocks=2, share_decompression=False,
                                         decompress_tile_bytes=1 << 16,
                                         loss_vocab_tile_bytes=1 << 16),
    "graph-tail-resident-budget": dict(graph_tail_blocks=1, frozen_weights="resident",
                                       resident_weight_bytes=40_000),
    "no-checkpoints": dict(checkpoint_blocks="none"),
}


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_direct_reads_give_the_mapped_gradients_bit_for_bit(setting, family, tiny_models,
                                                            packed_models, tmp_path):
    packed = packed_models[family, "int4"]
    adapter = write_random_adapter(tiny_models[family], tmp_path / "adapter", seed=31)
    input_ids, labels = random_batch(300, seed=32)
    knobs = SETTINGS[setting]
    loss, mapped, _ = engine_gradients(packed, adapter, input_ids, labels, **knobs)
    direct_loss, direct, engine = engine_gradients(packed, adapter, input_ids, labels,
                                                   store_reads="direct", **knobs)
    assert isinstance(engine.store, DirectReadStore)
    assert engine.store.read_stats.units_read >= len(engine.layers)  # the step read them
    assert direct_loss == loss
    assert direct.keys() == mapped.keys()
    unequal = [key for key in mapped if not torch.equal(direct[key], mapped[key])]
    assert not unequal, f"{setting}, {family}: gradients differ at {unequal[:3]}"


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_mezo_steps_read_directly_are_the_mapped_ones(family, packed_models):
    """MeZO's two forwards a step, three steps: the same losses and parameters to the bit."""
    packed = packed_models[family, "int4"]
    input_ids, labels = random_batch(300, seed=33)
    runs = []
    for reads in ("mapped", "direct"):
        engine = load_with_random_lora(packed, knobs=EngineKnobs(store_reads=reads))
        losses = [mezo.run_mezo_step(engine, input_ids, labels, step_seed=seed, lr=1e-2)
                  for seed in (1, 2, 3)]
        runs.append((losses, [p.detach().clone()
                              for _, p in mezo.named_lora_parameters(engine)]))
    (mapped_losses, mapped_params), (direct_losses, direct_params) = runs
    assert direct_losses == mapped_losses
    assert all(torch.equal(a, b) for a, b in zip(direct_params, mapped_params, strict=True))


def test_every_weight_reads_the_same_values_in_any_order(packed_models):
    packed = packed_models["llama", "int4"]
    with open_store(packed) as mapped, open_direct_store(packed, block_index) as direct:
        names = [n for n in mapped.names() if len(mapped.info(n).shape) == 2]
        requests = [(name, rows, cols) for name in names
                    for rows, cols in ((None, None), (slice(3, 17), None),
                                       (slice(5, 40), slice(32, 64)))]
        random.Random(0).shuffle(requests)
        for name, rows, cols in requests:
            expected = mapped.dequantize(name, torch.bfloat16, rows=rows, cols=cols)
            got = direct.dequantize(name, torch.bfloat16, rows=rows, cols=cols)
            assert torch.equal(got, expected), (name, rows, cols)
        assert direct.reader.direct, "tmp_path's filesystem takes O_DIRECT here"


def test_blocks_visited_in_pass_order_are_read_ahead(packed_models):
    """Forward over the blocks and back again: only the first block is read in line."""
    packed = packed_models["llama", "int4"]
    with open_direct_store(packed, block_index) as store:
        by_block = {}
        for name in store.names():
            if block_index(name) >= 0 and store.info(name).bits is not None:
                by_block.setdefault(block_index(name), []).append(name)
        order = sorted(by_block) + sorted(by_block, reverse=True)
        for _ in range(2):  # two steps
            for block in order:
                for name in by_block[block]:
                    store.dequantize(name, torch.float32)
        stats = store.read_stats
        assert stats.in_line_reads == 1, stats
        # a sweep turns with the two buffers holding the blocks it turns at: after the
        # first step's 2n - 2 reads, each step reads 2n - 4
        n = len(by_block)
        assert n >= 3
        assert stats.units_read == (2 * n - 2) + (2 * n - 4), stats


def test_a_long_head_is_read_in_runs_that_fit_the_buffers(packed_models):
    """Vocabulary tiles longer than a run, swept as the loss does, some columns: the same
    values, and only the sweep's first run read in line."""
    packed = packed_models["llama", "int4"]
    with open_store(packed) as mapped, open_direct_store(packed, block_index) as direct:
        head = "lm_head.weight"
        vocab = direct.info(head).shape[0]
        # shrink the buffers to 7 rows' worth: each tile of 17 rows takes 3 runs
        direct.reader.capacity_bytes = 3 * 4096 * 2 + 7 * sum(
            end - start for start, end in direct.row_spans(head, slice(0, 1)))
        assert direct._rows_per_run(head) == 7
        tiles = [slice(start, min(vocab, start + 17)) for start in range(5, vocab, 17)]
        runs = sum(-(-(tile.stop - tile.start) // 7) for tile in tiles)
        for cols in (None, slice(32, 64)):
            before = dataclasses.replace(direct.read_stats)
            for rows in tiles:
                got = direct.dequantize(head, torch.float32, rows=rows, cols=cols)
                assert torch.equal(got, mapped.dequantize(head, torch.float32, rows=rows,
                                                          cols=cols)), (rows, cols)
            after = direct.read_stats
            assert after.in_line_reads - before.in_line_reads == 1
            assert after.units_read - before.units_read == runs  # each run read once


def test_the_planner_counts_the_staging_buffers_the_reader_makes(tmp_path):
    """A model whose blocks are larger than the least buffer: the planner's two buffers
    hold the reader's, a few pages over at most."""
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=512, intermediate_size=1536,
                                      num_hidden_layers=2, num_attention_heads=8,
                                      num_key_value_heads=2, max_position_embeddings=64)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "hf")
    packed = pack_model(tmp_path / "hf", tmp_path / "packed", quant="int4", group_size=64)
    with open_direct_store(packed, block_index) as store:
        capacity = store.reader.capacity_bytes
    assert capacity > MIN_ROWS_BYTES
    planned = staging_bytes(Workload(load_architecture(tmp_path / "hf"), seq_len=64))
    assert 2 * capacity <= planned <= 2 * capacity + 16 * 4096


def test_direct_reads_leave_the_store_out_of_the_page_cache(packed_models, tmp_path):
    packed = shutil.copytree(packed_models["llama", "int4"], tmp_path / "packed")
    store_file = packed / STORE_FILENAME
    with open_direct_store(packed, block_index) as store:
        evict(store_file)  # the header's readahead, read plainly when opening
        for name in store.names():
            if store.info(name).bits is not None:
                store.dequantize(name, torch.float32)
        assert store.read_stats.bytes_read >= 0.9 * os.path.getsize(store_file)
        assert cached_pages(store_file) == 0
    with open_store(packed) as store:  # the mapping leaves what it read behind
        evict(store_file)
        for name in store.names():
            if store.info(name).bits is not None:
                store.dequantize(name, torch.float32)
    assert cached_pages(store_file) * 4096 >= 0.9 * os.path.getsize(store_file)


def test_a_truncated_store_names_its_file(packed_models, tmp_path):
    """Read in line, or read ahead and asked for later: the error names the file; a failed
    read ahead nothing asked for does not stop the store from closing."""
    packed = shutil.copytree(packed_models["llama", "int4"], tmp_path / "packed")
    with open_direct_store(packed, block_index) as store:
        last = max(store.names(), key=lambda n: store.file_span(n)[1])
        os.truncate(packed / STORE_FILENAME, store.file_span(last)[0])
        with pytest.raises(StoreError, match=STORE_FILENAME):
            store.dequantize(last, torch.float32)  # the head, in line
    blocks = [name for name in store.names() if block_index(name) >= 0
              and len(store.info(name).shape) == 2]
    first_of = {block_index(name): name for name in reversed(blocks)}
    last_block = max(first_of)
    for asked in (True, False):
        packed = shutil.copytree(packed_models["llama", "int4"], tmp_path / f"again-{asked}")
        with open_direct_store(packed, block_index) as store:
            os.truncate(packed / STORE_FILENAME, store.file_span(first_of[last_block])[0])
            store.dequantize(first_of[last_block - 1], torch.float32)  # the last read ahead
            if asked:
                with pytest.raises(StoreError, match=STORE_FILENAME):
                    store.dequantize(first_of[last_block], torch.float32)
        assert store.reader.fd == -1  # closed, the failed read ahead dropped


def evict(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # the copy's dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cached_pages(path) -> int:
    """Pages of ``path`` in the page cache, as util-linux's fincore counts them."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "PAGES", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])
