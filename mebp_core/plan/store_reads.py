"""What reading the packed store costs a step, mapped or direct (``EngineKnobs.store_reads``).

Mapped: the kernel caches the store's pages. Under a cap with no room for them beside the
step, what does not fit is read again by each sweep over the weights that needs it (MeBP's
forward and backward, MeZO's two forwards). Direct (``mebp_core.store.direct``): two staging
buffers of a block's packed bytes, counted as memory, and no page cache; every sweep reads
the store again. A thread reads the next block or run of head rows while the current one is
used, so the step waits in full only for what it could not see coming: the first unit of
each sweep over the blocks and over the head. The reads ahead still cost the step something
beside them (``READ_AHEAD_COST``); the engine's measured wait (``ReadStats.wait_s``) and the
measured steps check both.
"""

from __future__ import annotations

from functools import lru_cache

from mebp_core.config import EngineKnobs
from mebp_core.plan.arch import Architecture
from mebp_core.plan.passes import LOSS_PASSES
from mebp_core.plan.timing import MEMO_ENTRIES
from mebp_core.plan.workload import DTYPE_BYTES, Workload, packed_bytes_per_param, tile_rows
from mebp_core.store.staging import ALIGN_BYTES, MIN_ROWS_BYTES
from mebp_core.units import MB

# sweeps over the blocks' lazy weights a step: MeBP's forward and backward (a block's
# recompute and backward read it once between them), MeZO's two forwards; and over the head:
# once per loss pass (``passes.LOSS_PASSES``)
BLOCK_SWEEPS = 2
# What reading ahead costs the compute beside it, as a share of the reads' time at the
# disk's rate, where the host's calibration did not measure it (``read_ahead_cost``): on a
# 2-core AMX Xeon VM (qwen2.5-0.5b, seq 256, bf16, 533 MB read a step), 1.30-1.41 s a step
# read directly against 1.16-1.26 s mapped with the store cached, and 1.15 s with the reads
# skipped but the rest of the staging kept; 0.04-0.05 s of it the step's own waits:
# 0.1-0.2 s beside reads that take 0.31 s at 1.72 GB/s (BENCHMARKS, "Direct reads"); its
# calibration measured 0.27-0.31. A phone is priced as the host that plans for it.
READ_AHEAD_COST = 0.4
# What a mapped store's re-reads under a cap cost beside the disk's time: each is a page
# fault, with room made under the cap first, CPU work the read waits on. On two hosts
# whose disks differ 1.7x, the same step (qwen2.5-0.5b seq 256 bf16,
# ``lazy-ckpt1-ram-tail2-h-store-shared-tile8M``, 463 MB a step re-read by this count) paid
# +0.63-0.76 s a step under a 320 MB cap against uncapped on a model-167 AMX Xeon (its disk
# 1.67 GB/s: 0.29 s of reading) and +0.61 s on a Zen 5 EPYC (2.7-3.2 GB/s: 0.15-0.18 s):
# about 0.44 s of each is this cost, as if read again at this rate on top of the disk's
# (which fits both; a multiple of the disk's time fits only one). Hosts with a disk slower
# than 1 GB/s were not measured. With no room at all the smallest step reads slower still
# (its MLP in column chunks faults the down projection in again for each), which this
# leaves out: on the Zen 5, 2.90-3.00 s a step at S against 2.33 priced (1.53 uncapped)
MAPPED_REREAD_FAULT_BYTES_PER_S = 1.1e9
# The runtime's own file pages a step keeps using (torch's and Python's code): what a cap
# must leave room for before any store or checkpoint page stays cached. The same step read
# directly, no store pages cached, ran at its uncapped speed with 17 MB left under the cap
# beside its peak and thrashed with 12 (1.6-2.1 s a step, 1M pages refaulted) and 7 (2.8 s)
RUNTIME_FILE_BYTES = 20 * MB
# A block's unit holds its vectors too (norms, biases: at most this many of the hidden size,
# in float32 at most) and each array's 64-byte alignment in the file
BLOCK_VECTORS = 8
BLOCK_ARRAYS_PADDING = 64 * 3 * 16


def reads_direct(knobs: EngineKnobs, store_bytes: int) -> bool:
    """Whether this configuration stages the store's reads (it reads something lazily)."""
    return knobs.store_reads == "direct" and store_bytes > 0


def staging_bytes(workload: Workload) -> int:
    """The two staging buffers: each holds a block's packed bytes, its vectors and padding
    (or ``MIN_ROWS_BYTES``), rounded out to the alignment direct reads need."""
    arch = workload.arch
    block = arch.block_params() * packed_bytes_per_param(workload) + \
        BLOCK_VECTORS * arch.hidden_size * 4 + BLOCK_ARRAYS_PADDING
    unit = max(block, MIN_ROWS_BYTES)
    return 2 * (int(unit) // ALIGN_BYTES + 2) * ALIGN_BYTES


def lazy_store_bytes(workload: Workload, resident: frozenset[str]) -> int:
    """Packed bytes of the weights a step reads from the store: every one not resident
    (names in ``resident``), the embedding's rows aside (a sliver)."""
    return int(_lazy_params(workload.arch, resident) * packed_bytes_per_param(workload))


def lazy_head_bytes(workload: Workload, resident: frozenset[str]) -> int:
    """The head's packed bytes, when it is read from the store."""
    arch = workload.arch
    if arch.head_weight_name() in resident:
        return 0
    return int(arch.head_params() * packed_bytes_per_param(workload))


@lru_cache(maxsize=MEMO_ENTRIES)
def _lazy_params(arch: Architecture, resident: frozenset[str]) -> int:
    return sum(params for name, params in arch.frozen_weights() if name not in resident)


def step_read_bytes(workload: Workload, store_bytes: int, head_bytes: int) -> float:
    """What a step reads of the store when none of it stays cached: the blocks' lazy bytes
    in each sweep over the blocks, the head's (``head_bytes``, when lazy) in each loss
    pass."""
    return BLOCK_SWEEPS * (store_bytes - head_bytes) + \
        LOSS_PASSES[workload.method] * head_bytes


def direct_read_cost_bytes(workload: Workload, knobs: EngineKnobs, read_bytes: float,
                           read_ahead_cost: float | None) -> float:
    """A direct step's reads (``read_bytes``), priced as bytes read at the disk's rate: the
    ones it waits for in full (each loss pass's first run of head rows, a loss tile's packed
    rows, and the block it turns back to after it), the rest, read ahead, at
    ``read_ahead_cost`` (the host's measure; ``READ_AHEAD_COST`` without one)."""
    arch = workload.arch
    e = DTYPE_BYTES[workload.compute_dtype]
    head_rows = tile_rows(arch.vocab_size, arch.hidden_size, knobs.loss_vocab_tile_bytes, e)
    in_line = min(read_bytes, LOSS_PASSES[workload.method] * packed_bytes_per_param(workload)
                  * (arch.block_params() + head_rows * arch.hidden_size))
    cost = READ_AHEAD_COST if read_ahead_cost is None else read_ahead_cost
    return in_line + cost * (read_bytes - in_line)


def file_room_bytes(budget_bytes: int, peak_bytes: int) -> int:
    """What a cap of ``budget_bytes`` leaves for the step's own file pages (mapped store,
    mapped checkpoints) beside its peak, once the runtime's are kept."""
    return max(0, budget_bytes - peak_bytes - RUNTIME_FILE_BYTES)


def mapped_reread_bytes(store_bytes: int, read_bytes: float, room_bytes: int,
                        disk_read_bytes_per_s: float) -> float:
    """What a mapped step reads again when ``room_bytes`` of the store's ``store_bytes`` fit
    in the page cache, priced as bytes read at the disk's sequential rate
    (``disk_read_bytes_per_s``): the share of each sweep's reads (``read_bytes`` a step) the
    cache could not keep, each byte read again from the disk and faulted in at
    ``MAPPED_REREAD_FAULT_BYTES_PER_S``."""
    if store_bytes <= 0:
        return 0.0
    missing = max(0, store_bytes - max(0, room_bytes))
    slowdown = 1 + disk_read_bytes_per_s / MAPPED_REREAD_FAULT_BYTES_PER_S
    return slowdown * read_bytes * missing / store_bytes
