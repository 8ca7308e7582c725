"""The dequantization kernel against another version of it: this checkout's source and
another revision's (``--against REV``, read with git), both compiled here with the same flags
and timed alternately in one process on a packed model's int4 block weights:

- one call into a reused buffer, right after a matmul (torch's pool spinning, as in a step),
  at a 1 MB tile, an 8 MB tile and a whole MLP projection;
- a stream: every int4 block weight in 8 MB tiles, as a step without checkpoints reads each
  of them (the packed bytes come from memory, not the caches).

    .venv/bin/python benchmarks/dequant_kernels.py --against 2de7a05 --repeats 5

Prints ns per parameter for each version and this one's time over the other's, repeat by
repeat (median and spread), after checking both give the same bits. Outputs: bfloat16,
float32, and float32 holding bfloat16's values (the upcast path's lazy tile; a version older
than it is timed writing its plain float32 there).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from mebp_core.cpu import cpu_flags, cpu_model  # noqa: E402
from mebp_core.store import native  # noqa: E402
from mebp_core.store.kernel_build import SOURCE, compile_library  # noqa: E402
from mebp_core.store.reader import PackedStore  # noqa: E402
from mebp_core.store.resolve import resolve_model  # noqa: E402

TILE_BYTES = {"1 MB tile": 1 << 20, "8 MB tile": 8 << 20}
FLAGS_SHOWN = ("avx2", "avx512f", "avx512bw", "avx512_bf16", "amx_bf16")


def build(source: Path, directory: Path, name: str):
    target = directory / f"{name}.so"
    compile_library(target, source=source)
    return native.open_library(target)


def source_at(revision: str, directory: Path) -> Path:
    relative = SOURCE.relative_to(REPO)
    text = subprocess.run(["git", "show", f"{revision}:{relative}"], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout
    path = directory / "dequant-other.c"  # a revision may hold slashes (origin/main)
    path.write_text(text)
    return path


# (output dtype, the dtype whose values it holds): the last is the upcast path's lazy tile
OUTPUTS = {"bfloat16": (torch.bfloat16, None), "float32": (torch.float32, None),
           "float32 holding bf16": (torch.float32, torch.bfloat16)}


def fill(store: PackedStore, name: str, rows: slice, out: torch.Tensor, library,
         values: torch.dtype | None = None) -> None:
    """Dequantize into ``out``; a version without the function for ``values`` (older than
    it) writes its plain float32 instead: what its upcast path's tile cost."""
    raw = store.raw(name)
    group = store.group_size
    for asked in dict.fromkeys((values, None)):
        if native.dequantize_native(raw.data[rows], raw.scales[rows], raw.biases[rows],
                                    raw.bits, group, out, library=library, values=asked):
            return
    raise SystemExit(f"the kernel declined {name} ({out.dtype})")


def rows_per_tile(shape: tuple[int, int], tile_bytes: int, dtype: torch.dtype) -> int:
    return max(1, min(shape[0], tile_bytes // (shape[1] * dtype.itemsize)))


def time_calls(store, name, rows, dtype, values, library, calls: int) -> float:
    """ns per parameter of ``calls`` calls, each right after a small matmul."""
    out = torch.empty(rows.stop - rows.start, store.info(name).shape[1], dtype=dtype)
    x = torch.randn(256, 256, dtype=dtype)
    fill(store, name, rows, out, library, values)  # warm the buffer
    spent = 0.0
    for _ in range(calls):
        x @ x
        start = time.perf_counter()
        fill(store, name, rows, out, library, values)
        spent += time.perf_counter() - start
    return spent / calls / out.numel() * 1e9


def time_stream(store, names, dtype, values, library) -> float:
    """ns per parameter decompressing every weight in ``names`` in 8 MB tiles."""
    arena = torch.empty((8 << 20) // dtype.itemsize, dtype=dtype)
    x = torch.randn(256, 256, dtype=dtype)
    spent, params = 0.0, 0
    for name in names:
        shape = store.info(name).shape
        step = rows_per_tile(shape, 8 << 20, dtype)
        for first in range(0, shape[0], step):
            rows = slice(first, min(first + step, shape[0]))
            out = arena[: (rows.stop - rows.start) * shape[1]].view(-1, shape[1])
            x @ x
            start = time.perf_counter()
            fill(store, name, rows, out, library, values)
            spent += time.perf_counter() - start
            params += out.numel()
    return spent / params * 1e9


def same_bits(store, name, dtype, libraries) -> bool:
    shape = store.info(name).shape
    outs = []
    for library in libraries:
        out = torch.empty(shape, dtype=dtype)
        fill(store, name, slice(0, shape[0]), out, library)
        outs.append(out.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
    return all(torch.equal(outs[0], other) for other in outs[1:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--against", required=True, help="the git revision to compare with")
    p.add_argument("--model", default="preset:qwen2.5-0.5b")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--calls", type=int, default=40, help="per case and repeat")
    args = p.parse_args(argv)

    store = PackedStore(resolve_model(args.model))
    names = [n for n in store.names() if store.info(n).bits == 4 and ".layers." in n]
    if not names:
        raise SystemExit(f"{args.model}: no int4 block weights")
    projection = max(names, key=lambda n: store.info(n).shape[0])  # an MLP projection
    flags = sorted(cpu_flags() & set(FLAGS_SHOWN))
    print(f"{cpu_model()}; flags {' '.join(flags)}; torch threads {torch.get_num_threads()}")
    print(f"{args.model}: {len(names)} int4 block weights, "
          f"{sum(store.info(n).shape[0] * store.info(n).shape[1] for n in names) / 1e6:.0f} "
          f"M params; single calls on {projection} {store.info(projection).shape}\n")
    with tempfile.TemporaryDirectory() as directory:
        directory = Path(directory)
        builds = {"this": build(SOURCE, directory, "this"),
                  args.against: build(source_at(args.against, directory), directory, "other")}
        results: dict[tuple[str, str, str], list[float]] = {}
        for kind, (dtype, values) in OUTPUTS.items():
            if values is None and not same_bits(store, projection, dtype, builds.values()):
                raise SystemExit(f"the two versions differ in {dtype}")
            shape = store.info(projection).shape
            cases = {label: slice(0, rows_per_tile(shape, size, dtype))
                     for label, size in TILE_BYTES.items()}
            cases["whole projection"] = slice(0, shape[0])
            for _ in range(args.repeats):
                for version, library in builds.items():
                    for label, rows in cases.items():
                        results.setdefault((kind, label, version), []).append(time_calls(
                            store, projection, rows, dtype, values, library, args.calls))
                    results.setdefault((kind, "stream of every weight", version), []).append(
                        time_stream(store, names, dtype, values, library))
    print(f"| output | case | this, ns/param | {args.against}, ns/param | "
          f"this / {args.against}, median (spread) |")
    print("|---|---|---|---|---|")
    for (dtype, case, version), this in results.items():
        if version != "this":
            continue
        other = results[(dtype, case, args.against)]
        ratios = [a / b for a, b in zip(this, other, strict=True)]
        print(f"| {dtype} | {case} | {statistics.median(this):.3f} | "
              f"{statistics.median(other):.3f} | {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
