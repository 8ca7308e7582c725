"""How much anonymous memory an autograd graph costs per byte of the tensors it saves, for
the allocator the engines run under (``HostCalibration.allocator``) and the matmul dtype: the
temporaries freed between saved tensors leave holes the allocator may keep. Fitted to the
kernel's counts (each constant's comment says where); ``predict`` counts with them."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

# Anonymous memory an autograd graph costs per byte of the tensors it saves: the temporaries
# freed between saved tensors leave heap holes the allocator cannot return (fitted: 1.7-1.8x
# on smollm2-135m and qwen2.5-0.5b, seq 128-512, float32, without checkpoints).
GRAPH_RETENTION = 1.75
# A chained graph (every block's graph alive at once: a graph tail, the no-checkpoint step)
# keeps its MLPs' gate and up alone, recomputing the activation and the product in backward
# (``engine.gated_mlp``; the elementwise recompute, ~3 passes over a (tokens, intermediate)
# tensor a block, is left out of the time model); the two freed per block leave heap holes,
# so its blocks cost more per saved byte than a block recomputed alone. Kernel counts (Zen 4
# with avx512_bf16, 2026-12-04), per block of saved tensors above the planner's other terms
# of the tail's phase, qwen2.5-0.5b seq 256 with its vocabulary cut to 256, tails of 4, 8 and
# 16 and the whole model: float32 2.0-2.2x (native bf16 matmuls 1.22-1.43x, taken whole:
# below). Bounds above them, not fits; upcast bf16 (float32 matmuls) is counted above the
# kernel at CHAIN_RETENTION (+14..+24% uncapped, +3..+15% under hard caps). A chain's first
# blocks cost more than its later ones (the holes its first temporaries leave are filled by
# later blocks' tensors): with its real vocabulary under hard caps, at these retentions the
# kernel counted a tail of 5 in float32 9.5% above the prediction (and, at 1.5x, a tail of 8
# in bf16 4.5% above), long tails and the whole model 4.5-10% below. CHAIN_ONSET_BLOCKS:
# that excess, counted as blocks more in every chain. Native bf16 is counted as a slope
# per block above an onset, the onset larger and the slope smaller: with the real
# vocabulary (qwen2.5-0.5b seq 256; AMX Xeon, 2026-12-05, tails of 1-23) the kernel counted
# 10.9 MB more a block (10.2-12.1 in the Zen 4s' capped rows: 1.05-1.24x a chained block's
# saved tensors) above an onset of 2.5-4 blocks; at 1.5x with 1.25 blocks a tail of
# two counted 307-318 MB against 294.7 predicted (OOM-killed once under its cap), a tail of
# one up to 336 against 291.9 (10 steps under caps), a tail of 23 527 against 592. A bound
# on that slope, and the onset a tail of one needs (BENCHMARKS, "Short graph tails").
CHAIN_RETENTION = 2.25
NATIVE_BF16_CHAIN_RETENTION = 1.25
CHAIN_ONSET_BLOCKS = 1.25
NATIVE_BF16_CHAIN_ONSET_BLOCKS = 4
# Float32 matmuls (float32, and bf16 upcast as on AVX2 hosts) over a block recomputed alone
# whose MLP runs in one pass over every token and column: the kernel counts more than the
# block's graph and backward temporaries at the retentions above. Zen 4 with avx512_bf16,
# 2026-12-05, qwen2.5-0.5b, checkpoints every block, lazy unshared tiles, 3 runs each:
# float32 seq 256 322-347 MB against 306 counted (alike with tiles of 2, 4 and 16 MB: not
# the tiles), seq 512 448-480 against 415; upcast seq 256 273-300 against 263. The MLP in
# 256-column chunks (the smallest budgets) within 3% without it. A hard cap of 340 MB, which
# the planner said held, killed 2 of 3 float32 runs. A bound over those rows (upcast at seq
# 512 is over-counted by 12-18% with it), not a fit. Native bf16 matmuls under glibc too
# (AMX Xeon, 2026-12-05, ``benchmarks/heap_retention.py``, checkpoints every block, uncapped):
# qwen2.5-0.5b at 256, 512, 1024 and 2048 tokens 307.1, 387.3, 478.1 and 887.6 MB against
# 294.0, 356.3, 480.9 and 730.2 counted, smollm2-135m at 256 250.8 against 237.3; with the
# factor +3.0%, +3.5%, +19%, +2.3% and -1.5%.
WHOLE_MLP_BLOCK_RETENTION = 1.5
# The heap holes above are glibc's: under jemalloc (``mebp_core.allocator``, every engine
# where the host has it) a freed tensor's extent serves the next of its size. Kernel counts,
# uncapped, 3 steps each (AVX2 EPYC, 2026-12-05; float32 matmuls, the only path that host
# has): a chained block cost 0.65-0.85x its saved tensors above the planner's other terms
# (qwen2.5-0.5b seq 256: float32 tails of 16 and the whole model, upcast bf16 the whole
# model; the whole model 607.8 MB where 1186.9 was counted; smollm2-135m's 441.5 MB, glibc's
# 677.8 on the same host), with no onset (a tail of 8 within 3%), and a float32 block
# recomputed alone over its whole MLP no more than the graph's retention (323.4 MB where
# 393.7 was counted; at 256-token vocabularies, where the block is most of the footprint,
# 95.7 above the imports where 200.0 was). Counted at 1.0x, no onset, no whole-MLP block
# term, and a block recomputed alone at 1.25x its saved tensors: 15 rows (those, tails of
# 1-8, the checkpointed steps and the smallest budgets' picks) then +0.8%..+12% above the
# kernel. At 2048 tokens (``test_block_memory.py``'s one block of four, bf16 upcast) the
# kernel counted 0.50-0.58 of even that (the backward temporaries' term below takes some
# of it). Native bf16 matmuls have retentions of their own (below); plain backprop's chain
# keeps glibc's (bounds: jemalloc counted below glibc in every row measured).
JEMALLOC_GRAPH_RETENTION = 1.25
JEMALLOC_CHAIN_RETENTION = 1.0
# A block's backward temporaries (``predict._backward_transient_bytes``, fitted on glibc)
# under jemalloc, per byte counted: past 256 tokens glibc's count grew twice as fast as the
# kernel's. AMX Xeon, 2026-12-05, ``benchmarks/heap_retention.py`` uncapped, checkpoints
# every block and the smallest budget's pick (native bf16: qwen2.5-0.5b at 512-2048 tokens,
# smollm2-135m at 1024-2048; float32: qwen2.5-0.5b at 256-2048; upcast bf16: both at 256 and
# 1024): counted at 1.0 the rows read up to +48% above the kernel (the seq-1024 picks at S
# +17% and +20%); at 0.6, with native bf16's per-token bytes left out
# (``predict.NATIVE_BF16_BYTES_PER_TOKEN``), those 26 rows and the 12 of the seq-256 tails
# and steps above -3.6%..+25% (smollm2-135m's native bf16 step over its whole MLP the least,
# qwen2.5-0.5b's at 2048 tokens the most).
JEMALLOC_TRANSIENT_RETENTION = 0.6


@dataclass(frozen=True)
class HeapRetention:
    """How much of a graph's freed temporaries an allocator keeps, per byte of its saved
    tensors: a block recomputed alone's, a chained block's, the blocks a chain's start
    costs, the factor on a block recomputed alone over its whole MLP, and on a block's
    backward temporaries."""

    graph: float
    chain: float
    chain_onset_blocks: float
    whole_mlp_block: float
    transient: float = 1.0


HEAP_RETENTION = MappingProxyType({
    "glibc": HeapRetention(GRAPH_RETENTION, CHAIN_RETENTION, CHAIN_ONSET_BLOCKS,
                           WHOLE_MLP_BLOCK_RETENTION),
    "jemalloc": HeapRetention(JEMALLOC_GRAPH_RETENTION, JEMALLOC_CHAIN_RETENTION, 0.0, 1.0,
                              JEMALLOC_TRANSIENT_RETENTION),
})
# Native bf16 matmuls' graphs. Under jemalloc (AMX Xeon, 2026-12-05;
# ``benchmarks/heap_retention.py``, uncapped, 3 steps; BENCHMARKS, "Native bf16 under
# jemalloc") a chained block cost about 0.45-0.95x its saved tensors above an onset of about
# 3 blocks: qwen2.5-0.5b seq 256 tails of 1-16 and the whole model 284.9-434.3 MB (glibc's
# retentions counted +8%..+34%), smollm2-135m's 242.7-342.2 (+7%..+24%). At 0.85x above 4
# blocks, with the transient term above, those rows read -3.6%..+7.9% above the kernel. A
# block recomputed alone keeps glibc's graph retention there (lower went further below).
NATIVE_BF16_JEMALLOC_CHAIN_RETENTION = 0.85
NATIVE_BF16_HEAP_RETENTION = MappingProxyType({
    "glibc": HeapRetention(GRAPH_RETENTION, NATIVE_BF16_CHAIN_RETENTION,
                           NATIVE_BF16_CHAIN_ONSET_BLOCKS, WHOLE_MLP_BLOCK_RETENTION),
    "jemalloc": HeapRetention(GRAPH_RETENTION, NATIVE_BF16_JEMALLOC_CHAIN_RETENTION,
                              NATIVE_BF16_CHAIN_ONSET_BLOCKS, 1.0, JEMALLOC_TRANSIENT_RETENTION),
})
# Plain backprop's chain keeps all four MLP tensors: in native bf16 1.11-1.38x a block's
# saved tensors (same host and model, 2026-12-04), float32 at GRAPH_RETENTION.
NATIVE_BF16_PLAIN_CHAIN_RETENTION = 1.45


def heap_retention(allocator: str, native_bf16: bool) -> HeapRetention:
    """The retentions of a graph whose matmuls run in native bf16 (or not) under
    ``allocator``."""
    return (NATIVE_BF16_HEAP_RETENTION if native_bf16 else HEAP_RETENTION)[allocator]
