"""Measure this host's throughputs for the planner; prints one JSON object.

Run as ``python -m mebp_core.measure_host [--threads N]`` (the planner starts it in a
subprocess so its own process never imports torch). It runs the engine, so it lives beside
the planner, not in it. Every figure is the median of a few repeats, and each kind of figure
records its spread; the result says when it was measured, under what load average, and
with which dequantization kernel.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from mebp_core.allocator import loaded_allocator
from mebp_core.cache import default_cache_dir
from mebp_core.kernel_memory import read_memory
from mebp_core.plan.calibration import DECOMPRESS_PROJECTION_PARAMS, DECOMPRESS_SIZES
from mebp_core.proc import die_with_parent

MATMUL_TOKENS = (64, 256, 1024)  # tokens per matmul: short batches to long ones (flat beyond)
MATMUL_OUTS = (256, 1024, 4096)  # output widths: small tiles to whole MLP projections
_D = 1024  # a small model's hidden size
_F = DECOMPRESS_PROJECTION_PARAMS // _D  # and its MLP's


SLOW_S = 0.2  # a measurement this slow is not repeated, and larger sizes are not tried
REPEATS = 5
FAST_TOTAL_S, MAX_REPEATS = 0.01, 50  # a fast measurement repeats for about this long


class _Spreads:
    """The spread of each kind of figure, at its worst point: the upper quartile of its
    repeats over the lower (one interrupted or lucky repeat of a sub-millisecond op says
    nothing about the host's load; measured idle, slowest over fastest reached 27x). 1.0 for
    a measurement too slow to repeat."""

    def __init__(self) -> None:
        self.by_kind: dict[str, float] = {}

    def time(self, kind: str, fn, repeats: int = REPEATS) -> float:
        """The median of ``repeats`` timed runs of ``fn`` after a warm-up run (more for
        a sub-millisecond ``fn``, whose quartiles a few repeats leave to chance)."""
        fn()  # warm up: first touch, kernel selection, a library's one-time start (oneDNN's
        # first bf16 matmul at one thread took over SLOW_S, and was once taken as its rate)
        start = time.perf_counter()
        fn()
        seconds = [time.perf_counter() - start]
        if seconds[0] <= SLOW_S:
            repeats = max(repeats, min(MAX_REPEATS, int(FAST_TOTAL_S / max(seconds[0], 1e-9))))
            seconds = []
            for _ in range(repeats):
                start = time.perf_counter()
                fn()
                seconds.append(time.perf_counter() - start)
        spread = 1.0
        if len(seconds) >= 4:
            low, _, high = statistics.quantiles(seconds, n=4, method="inclusive")
            spread = high / max(low, 1e-12)
        self.by_kind[kind] = max(self.by_kind.get(kind, 1.0), spread)
        return statistics.median(seconds)


def measure(threads: int | None) -> dict:
    import torch  # noqa: F401 (imported here so the baseline below includes it)

    import mebp_core.engine.train  # noqa: F401 (the imports of a training run)

    runtime = read_memory().charged_bytes
    if threads:
        torch.set_num_threads(threads)
    from mebp_core.store.native import kernel_name
    from mebp_core.store.quant import dequantize, quantize

    kernel = kernel_name()  # built (if it must be) before anything is timed
    spreads = _Spreads()
    result: dict = {"threads": torch.get_num_threads(), "runtime_bytes": runtime,
                    "torch": torch.__version__, "kernel": kernel,
                    "allocator": loaded_allocator(),
                    "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
                    "load_before": os.getloadavg()[0]}
    gen = torch.Generator().manual_seed(0)
    result["matmul_flops"] = {name: _matmul_rates(dtype, gen, spreads)
                              for name, dtype in (("float32", torch.float32),
                                                  ("bfloat16", torch.bfloat16))}

    weight = torch.randn(_F, _D, generator=gen) * 0.02
    q = quantize(weight[:8], bits=4, group_size=64)
    out = torch.empty(8, _D)
    call_s = spreads.time("decompress_call", lambda: dequantize(
        q.data, q.scales, q.biases, 4, 64, torch.float32, out=out), repeats=50)
    result["decompress_call_s"] = call_s
    result["decompress_params_per_s"] = _decompress_rates(weight, call_s, spreads)

    # activation-sized operands (64 MB each): main-memory bandwidth, not cache
    a = torch.randn(16 << 20, generator=gen)
    b = torch.randn(16 << 20, generator=gen)
    seconds = spreads.time("elementwise", lambda: (a * b).add_(a))  # 2 reads, a write, twice
    result["elementwise_bytes_per_s"] = 6 * a.numel() * 4 / seconds
    small = torch.randn(1, 64, requires_grad=True)
    small_w = torch.randn(64, 64)
    # an op recorded by autograd, then its backward: what a tiny op costs inside a step
    seconds = spreads.time("op_overhead", lambda: torch.stack(
        [small @ small_w for _ in range(100)]).sum().backward())
    result["op_overhead_s"] = seconds / 200
    with _scratch_file() as scratch:
        result["disk_read_bytes_per_s"] = _disk_read_rate(scratch)
        result["read_ahead_cost"] = _read_ahead_cost(scratch, result["disk_read_bytes_per_s"],
                                                     gen)
    result["spread"] = spreads.by_kind
    result["load_after"] = os.getloadavg()[0]
    return result


def _decompress_rates(weight, call_s: float, spreads: _Spreads) -> dict:
    """quant -> dtype -> output params -> params/s, net of each call's fixed cost: sizes up
    to a projection's in one call into a reused buffer (a tile), larger ones as projections
    written one after another into one buffer (a shared block), from sources that differ
    projection to projection as a block's do."""
    import torch

    from mebp_core.store.quant import quantize

    rates: dict[str, dict[str, dict[str, float]]] = {}
    weights = [weight.roll(shift, 0) for shift in range(4)]
    for quant, bits in (("int4", 4), ("int8", 8), ("none", None)):
        sources = [quantize(w, bits=bits, group_size=64) if bits else w.to(torch.bfloat16)
                   for w in weights]
        rates[quant] = {}
        for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            rates[quant][name] = {}
            buffer = torch.zeros(max(DECOMPRESS_SIZES), dtype=dtype)  # faulted in already
            for size in DECOMPRESS_SIZES:
                calls = _decompress_calls(size, weight.shape, bits, sources, dtype, buffer)
                seconds = spreads.time("decompress", lambda calls=calls: [
                    call() for call in calls])
                rates[quant][name][str(size)] = size / max(seconds - len(calls) * call_s,
                                                           seconds / 2)
    return rates


def _decompress_calls(size: int, shape, bits: int | None, sources, dtype, buffer) -> list:
    """Calls that dequantize ``size`` parameters into ``buffer``: one projection's rows,
    or projections one after another."""
    from mebp_core.store.quant import dequantize

    rows, cols = shape
    calls = []
    for index, start in enumerate(range(0, size, rows * cols)):
        n_rows = min(rows, (size - start) // cols)
        out = buffer[start : start + n_rows * cols].view(n_rows, cols)
        source = sources[index % len(sources)]
        if bits is None:
            calls.append(lambda out=out, source=source, n=n_rows: out.copy_(source[:n]))
        else:
            calls.append(lambda out=out, source=source, n=n_rows: dequantize(
                source.data[:n], source.scales[:n], source.biases[:n], bits, 64, dtype,
                out=out))
    return calls


def _matmul_rates(dtype, gen, spreads: _Spreads) -> dict[str, dict[str, dict[str, float]]]:
    """FLOP/s by form, output width and tokens. "nt" is a projection's forward (x @ W^T,
    out = W's rows); "nn" its input gradient (g @ W, W's rows = out, the reduction)."""
    import torch

    rates: dict[str, dict[str, dict[str, float]]] = {"nt": {}, "nn": {}}
    for out in MATMUL_OUTS:
        w = (torch.randn(out, _D, generator=gen) * 0.02).to(dtype)
        rates["nt"][str(out)], rates["nn"][str(out)] = {}, {}
        for form in ("nt", "nn"):
            for tokens in MATMUL_TOKENS:  # beyond the last size measured the rate is flat
                flops = 2 * tokens * _D * out
                if form == "nt":
                    x = torch.randn(tokens, _D, generator=gen).to(dtype)
                    seconds = spreads.time("matmul", lambda x=x, w=w: x @ w.T)
                else:
                    g = torch.randn(tokens, out, generator=gen).to(dtype)
                    seconds = spreads.time("matmul", lambda g=g, w=w: g @ w)
                rates[form][str(out)][str(tokens)] = flops / seconds
                if seconds > SLOW_S:
                    break
    return rates


SCRATCH_FILE_BYTES = 64 << 20
READ_AHEAD_UNIT_BYTES = 8 << 20  # a block's packed bytes, about
READ_AHEAD_REPEATS = 3


@contextmanager
def _scratch_file() -> Iterator[str]:
    """A fresh file of ``SCRATCH_FILE_BYTES`` in the cache dir (the disk packed stores live
    on), written through to the disk; removed after."""
    cache = default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=cache) as handle:
        handle.write(os.urandom(1 << 20) * (SCRATCH_FILE_BYTES >> 20))
        handle.flush()
        os.fsync(handle.fileno())
        yield handle.name


def _disk_read_rate(path: str) -> float:
    """Cold sequential read of ``path``: its pages are dropped from the page cache first."""
    with open(path, "rb", buffering=0) as reader:
        os.posix_fadvise(reader.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        start = time.perf_counter()
        nbytes = 0
        while chunk := reader.read(4 << 20):
            nbytes += len(chunk)
        return nbytes / (time.perf_counter() - start)


def _read_ahead_cost(path: str, disk_rate: float, gen) -> float | None:
    """What reading a file with ``O_DIRECT`` on a thread costs the compute beside it, as a
    share of the reads' time at ``disk_rate``: a block-sized matmul loop alone and beside a
    thread reading ``path`` a block-sized unit at a time, alternately, the median of
    each. (A VM's reads take compute time its guest does not see as its own: on an AMX
    Xeon a bf16 loop ran 1.39x slower beside reads at 1.79 GB/s, 0.27 of their time.)
    None where the filesystem takes no ``O_DIRECT``."""
    import threading

    import torch

    from mebp_core.cpu import native_bf16_matmul

    dtype = torch.bfloat16 if native_bf16_matmul() else torch.float32
    x = torch.randn(256, 896, generator=gen).to(dtype)
    w = torch.randn(4864, 896, generator=gen).to(dtype)  # qwen2.5-0.5b's MLP, 256 tokens

    def loop() -> float:
        start = time.perf_counter()
        for _ in range(100):
            x @ w.T
        return time.perf_counter() - start

    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return None
    buffer = mmap.mmap(-1, READ_AHEAD_UNIT_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        loop()
        alone, beside, read = [], [], []
        for _ in range(READ_AHEAD_REPEATS):
            alone.append(loop())
            stop, done = threading.Event(), [0]
            reader = threading.Thread(target=_read_until, args=(fd, buffer, stop, done))
            reader.start()
            seconds = loop()
            stop.set()
            reader.join()
            beside.append(seconds)
            read.append(done[0])
    finally:
        os.close(fd)
    extra = statistics.median(beside) - statistics.median(alone)
    read_s = statistics.median(read) / disk_rate
    return min(1.0, max(0.0, extra / read_s)) if read_s > 0 else None


def _read_until(fd: int, buffer: mmap.mmap, stop, done: list[int]) -> None:
    """Read the file from its start, over and over, until ``stop``; bytes read in ``done``."""
    view, offset = memoryview(buffer), 0
    while not stop.is_set():
        n = os.preadv(fd, [view], offset)
        done[0] += n
        offset = 0 if n < len(view) else offset + n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--parent-pid", type=int,
                        help="exit when this process (the one waiting for the figures) does")
    args = parser.parse_args()
    if args.parent_pid is not None:  # a service stopped mid-measurement leaves no child
        die_with_parent(signal.SIGKILL, args.parent_pid)
    print(json.dumps(measure(args.threads)))


if __name__ == "__main__":
    main()
