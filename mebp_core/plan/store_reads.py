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

from mebp_core.config import EngineKnobs
from mebp_core.plan.workload import DTYPE_BYTES, Workload, packed_bytes_per_param, tile_rows
from mebp_core.store.staging import ALIGN_BYTES, MIN_ROWS_BYTES
from mebp_core.units import MB

# sweeps over every lazy weight a step makes: MeBP's forward and backward (a block's
# recompute and backward read it once between them), MeZO's two forwards
STORE_SWEEPS = 2
# What reading ahead costs the compute beside it, as a share of the reads' time at the
# disk's rate: on a 2-core AMX Xeon VM (qwen2.5-0.5b, seq 256, bf16, 533 MB read a step),
# 1.30-1.38 s a step read directly against 1.19-1.26 s mapped with the store cached and
# 1.15 s with the reads skipped but the rest of the staging kept; 0.05 s of it the step's
# own waits: 0.1-0.2 s beside reads that take 0.31 s at 1.72 GB/s (BENCHMARKS, "Direct
# reads"). Unmeasured on a phone, priced alike there.
READ_AHEAD_COST = 0.4
# What a mapped store's re-reads under a cap cost, as a multiple of their time at the disk's
# sequential rate: each is a page fault, a read, and room made under the cap first (the same
# host and step: 1.88-1.99 s a step under a 320 MB cap against 1.23-1.25 s uncapped, for
# 536 MB a step re-read by this count, 0.32 s at 1.67 GB/s: 2.1-2.3x)
MAPPED_REREAD_COST = 2.2
# The runtime's own file pages a step keeps using (torch's and Python's code): what a cap
# must leave room for before any store or checkpoint page stays cached. The same step read
# directly, no store pages cached, ran at its uncapped speed with 17 MB left under the cap
# beside its peak and thrashed with 12 (1.6-2.1 s a step, 1M pages refaulted) and 7 (2.8 s)
RUNTIME_FILE_BYTES = 20 * MB


def reads_direct(knobs: EngineKnobs, store_bytes: int) -> bool:
    """Whether this configuration stages the store's reads (it reads something lazily)."""
    return knobs.store_reads == "direct" and store_bytes > 0


def staging_bytes(workload: Workload) -> int:
    """The two staging buffers: each holds a block's packed bytes (or ``MIN_ROWS_BYTES``),
    rounded to the alignment direct reads need."""
    block = workload.arch.block_params() * packed_bytes_per_param(workload)
    unit = max(block, MIN_ROWS_BYTES)
    return 2 * (int(unit) // ALIGN_BYTES + 2) * ALIGN_BYTES


def direct_read_cost_bytes(workload: Workload, knobs: EngineKnobs, store_bytes: int
                           ) -> float:
    """A direct step's reads, priced as bytes read at the disk's rate: the ones it waits for
    (per sweep, its first block and its first run of head rows, a loss tile's packed rows)
    in full, the rest, read ahead, at ``READ_AHEAD_COST``."""
    arch = workload.arch
    per_param = packed_bytes_per_param(workload)
    e = DTYPE_BYTES[workload.compute_dtype]
    head_rows = tile_rows(arch.vocab_size, arch.hidden_size, knobs.loss_vocab_tile_bytes, e)
    read = STORE_SWEEPS * store_bytes
    in_line = min(read, STORE_SWEEPS * (arch.block_params() + head_rows * arch.hidden_size)
                  * per_param)
    return in_line + READ_AHEAD_COST * (read - in_line)


def file_room_bytes(budget_bytes: int, peak_bytes: int) -> int:
    """What a cap of ``budget_bytes`` leaves for the step's own file pages (mapped store,
    mapped checkpoints) beside its peak, once the runtime's are kept."""
    return max(0, budget_bytes - peak_bytes - RUNTIME_FILE_BYTES)


def mapped_reread_bytes(store_bytes: int, room_bytes: int) -> float:
    """Store bytes a mapped step reads again when ``room_bytes`` of its file pages fit, priced
    as bytes read at the disk's sequential rate: each sweep reads what the cache could not
    keep, at ``MAPPED_REREAD_COST``."""
    return MAPPED_REREAD_COST * STORE_SWEEPS * max(0, store_bytes - max(0, room_bytes))
