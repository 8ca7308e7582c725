"""Which kinds of work, priced with two constants fitted on qwen2.5-0.5b alone, can reproduce
the MeBP paper's ten iPhone 15 Pro Max step times (issue 14, item 3)?

Each structure prices a step as ``c1 * x1 + c2 * x2 + known``: two counts of the paper
configuration's work (``devices.paper_step_work``, seq 256) and, where the structure does
not fit bandwidth itself, the decompression and elementwise traffic at the reference's
sourced memory bandwidth. c1 and c2 solve the two qwen2.5-0.5b figures (MeBP and MeZO);
every other figure is a prediction. A structure with a negative constant is unphysical.

    .venv/bin/python benchmarks/device_structures.py

Pure arithmetic on the planner's counts: no torch, seconds to run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.device_estimates import MEBP_PAPER, SEQ_LEN  # noqa: E402
from mebp_core.plan.devices import (  # noqa: E402
    DeviceRates,
    device_step_time,
    paper_knobs,
    paper_step_work,
    reference_rates,
)
from mebp_core.plan.timing import step_work  # noqa: E402

TOLERANCE = 0.15
# LCSB (MISSION section 3): weight decompression is 32-42% of MeBP's backward time
LCSB_DECOMPRESSION_SHARES = (0.32, 0.37, 0.42)
FIT_ON = "qwen2.5-0.5b"
Count = Callable[[object, object, str], float]  # (work, workload, method) -> a count


def flops(work, workload, method) -> float:
    return work.matmul_flops


def flops_backward_twice(work, workload, method) -> float:
    """FLOPs with every backward matmul counted twice: what a backward that also forms the
    frozen weights' gradients (or recomputes each block's forward once more) does."""
    return sum(f * (2 if form == "nn" else 1) for f, _, _, form in work.matmuls)


def flops_backward_decompressing(share: float) -> Count:
    """FLOPs with MeBP's backward (its recompute, its vector-Jacobian products and the head's
    gradient: the step less one forward) costing 1 / (1 - share) of its matmuls, so that
    decompressing its weights takes ``share`` of its time, as LCSB measured on phones."""
    def count(work, workload, method) -> float:
        if method != "mebp":
            return work.matmul_flops
        mezo = replace(workload, method="mezo")
        forward = step_work(mezo, paper_knobs(), set()).matmul_flops / 2
        return work.matmul_flops + share / (1 - share) * (work.matmul_flops - forward)
    return count


def ops(work, workload, method) -> float:
    return work.ops + work.decompress_calls


def logits(work, workload, method) -> float:
    """Logit elements over two passes of the vocabulary (MeZO's two losses; MeBP's loss
    and its gradient)."""
    return 2 * workload.tokens * workload.arch.vocab_size


def layers(work, workload, method) -> float:
    return workload.arch.num_layers


def per_step(work, workload, method) -> float:
    return 1.0


def bytes_moved(work, workload, method) -> float:
    parts = device_step_time(work, workload, DeviceRates(1.0, 0.0, 1.0, 1.0))
    return parts["decompress"] + parts["elementwise"]  # bytes, at 1 byte/s


STRUCTURES: dict[str, tuple[Count, Count, bool]] = {
    # name: (count 1, count 2, whether traffic is priced at the sourced bandwidth)
    "FLOPs + ops (adopted)": (flops, ops, True),
    "FLOPs + bytes moved (bandwidth fitted)": (flops, bytes_moved, False),
    "FLOPs + a cost per step": (flops, per_step, True),
    "FLOPs + a cost per layer": (flops, layers, True),
    "FLOPs + a cost per logit": (flops, logits, True),
    "FLOPs, backward x2 + ops": (flops_backward_twice, ops, True),
    "FLOPs, backward x2 + a cost per layer": (flops_backward_twice, layers, True),
    "FLOPs, backward x2 + a cost per logit": (flops_backward_twice, logits, True),
    **{f"FLOPs, backward decompressing {share:.0%} of its time (LCSB) + a cost per {unit}":
       (flops_backward_decompressing(share), count, True)
       for share in LCSB_DECOMPRESSION_SHARES
       for unit, count in (("layer", layers), ("logit", logits))},
}


def figure(model: str, method: str, first: Count, second: Count, traffic: bool
           ) -> tuple[float, float, float]:
    work, workload = paper_step_work(f"preset:{model}", SEQ_LEN, method)
    known = 0.0
    if traffic:
        memory = reference_rates().memory_bytes_per_s
        parts = device_step_time(work, workload, DeviceRates(1.0, 0.0, memory, 1.0))
        known = parts["decompress"] + parts["elementwise"]
    return first(work, workload, method), second(work, workload, method), known


def fit(first: Count, second: Count, traffic: bool) -> tuple[float, float]:
    """The two constants that reproduce the FIT_ON model's MeBP and MeZO figures."""
    (a1, b1, k1), (a2, b2, k2) = (figure(FIT_ON, m, first, second, traffic)
                                  for m in ("mebp", "mezo"))
    t1, t2 = (published - k for published, k in zip(MEBP_PAPER[FIT_ON], (k1, k2),
                                                     strict=True))
    det = a1 * b2 - a2 * b1
    return (t1 * b2 - t2 * b1) / det, (a1 * t2 - a2 * t1) / det


def main() -> int:
    models = list(MEBP_PAPER)
    print("| structure | " + " | ".join(f"{m} MeBP / MeZO" for m in models if m != FIT_ON)
          + " | predicted within 15% | constants |")
    print("|---|" + "---|" * (len(models) + 1))
    for name, (first, second, traffic) in STRUCTURES.items():
        c1, c2 = fit(first, second, traffic)
        cells, held = [], 0
        for model in models:
            if model == FIT_ON:
                continue
            errors = []
            for method, published in zip(("mebp", "mezo"), MEBP_PAPER[model], strict=True):
                x1, x2, known = figure(model, method, first, second, traffic)
                errors.append((c1 * x1 + c2 * x2 + known) / published - 1)
            held += sum(abs(e) <= TOLERANCE for e in errors)
            cells.append(" / ".join(f"{e:+.0%}" for e in errors))
        physical = "" if c1 > 0 and c2 >= 0 else " (negative: unphysical)"
        print(f"| {name} | " + " | ".join(cells) + f" | {held}/8 | "
              f"{c1:.3g}, {c2:.3g}{physical} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
