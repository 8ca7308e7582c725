"""The planner's figures are part of its contract: made faster, a plan must stay the same to
the last bit. Each case's every figure (memory by component, time by part before and after
the host's correction, the store and checkpoint-file bytes, the work a phone is priced on,
the phone's time, feasibility, reason and the front) is digested at full precision and held
to the digest recorded from the planner before it was made faster (commit 433de5c, 0.7-1 s
a plan).

A deliberate change to the model moves these digests: record them again with
``python tests/mebp_core/plan/test_plan_figures_unchanged.py`` and say so in the commit."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import replace

import pytest

from mebp_core.config import EngineKnobs, TrainConfig
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.calibration import HostCalibration
from mebp_core.plan.correction import correction_from
from mebp_core.plan.devices import get_device
from mebp_core.plan.grid import candidate_knobs, frozen_weight_choices
from mebp_core.plan.planner import Plan, make_plan
from mebp_core.plan.workload import Workload
from mebp_core.units import MB

# name -> (model, TrainConfig fields, make_plan arguments: budget_mb, device, knobs, margin,
# bf16_matmul; "corrected": the host's time correction from recorded runs)
CASES = {
    "qwen-mebp-pixel8": ("qwen2.5-0.5b", {"seq_len": 256}, {"device": "pixel-8"}),
    "qwen-mebp-bf16-upcast-corrected": (
        "qwen2.5-0.5b", {"seq_len": 512, "compute_dtype": "bfloat16", "lora_rank": 16},
        {"budget_mb": 400, "bf16_matmul": "float32", "corrected": True}),
    "smollm-mebp-300mb-adamw-accum": (
        "smollm2-135m", {"seq_len": 256, "batch_size": 2, "optimizer": "adamw",
                         "grad_accum_steps": 2}, {"budget_mb": 300}),
    "smollm-mebp-native-bf16-corrected-android": (
        "smollm2-135m", {"seq_len": 128, "compute_dtype": "bfloat16",
                         "lora_targets": ("q", "v")},
        {"device": "android-4gb", "bf16_matmul": "native", "corrected": True}),
    "gemma-mebp-nobudget-int8": ("gemma3-1b", {"seq_len": 256, "quant": "int8",
                                               "group_size": 32}, {}),
    "qwen3-mezo-iphone15": ("qwen3-0.6b", {"seq_len": 128, "method": "mezo"},
                            {"device": "iphone-15", "corrected": True}),
    "llama-backprop-2gb": ("llama3.2-1b", {"seq_len": 256, "method": "backprop"},
                           {"budget_mb": 2000, "margin": 0.2}),
    "tiny-mebp-requested-knobs": (
        "tiny", {"seq_len": 32, "max_grad_norm": 1.0},
        {"budget_mb": 64, "knobs": [EngineKnobs(frozen_weights="resident",
                                                checkpoint_blocks=2)]}),
}
# from the planner of commit 433de5c, then of the one whose recompute skips the down
# projection's product (not gemma3's, MeZO's or backprop's) and whose front is judged on
# the figures as shown (gemma3's digest moved by that alone), then of the one whose grid
# offers the MLP in chunks of intermediate columns (not gemma3's: its digest is unchanged),
# then of the one counting native bf16's chained graphs at their own retention (the native
# bf16 case's alone), then of the one whose chained graphs keep an MLP's gate and up alone
# (MeBP's cases that plan a chained graph: not MeZO's, backprop's, whose graph stays plain,
# or the requested knobs'), then of the one whose grid's MLP columns are no wider than a
# small tile's slice of a weight (the qwen cases, MeZO's too: the others' columns were that
# narrow already, or their grids have none), then of the one whose columns are equal chunks
# of about 64 tokens' tensors and which tries no token chunks where columns run (all but
# gemma3's, backprop's and the requested knobs'), then of the one counting a native bf16
# chain at 1.25x its blocks above an onset of 4 (the native bf16 case's alone), then of the
# one pricing a mapped store's re-reads under a budget as the share of each sweep's reads
# (the blocks twice a step, the head once a loss pass) that does not fit, at 2.5x the disk's
# sequential rate, after 20 MB of the runtime's own file pages (the cases with a
# budget or a phone whose store does not fit beside the step: not gemma3's, backprop's or
# the requested knobs'; the Pixel 8's pick is lazy now, where its resident weights left
# the rest of the store to be read again every sweep), then of the one pricing each byte
# of that share at its read from the disk plus its fault at 1.1 GB/s (the same cases; no
# pick changed), then of the one pricing the loss's vocabulary tiles' dispatch on the host
# (every case: a step's work gained that field, and MeBP's and MeZO's host time its price;
# no pick changed)
RECORDED = {
    'gemma-mebp-nobudget-int8': (426, 'resident-nockpt-h-store-shared-tile8M', 292,
        '9d9e147fd41cb43e6ed69b9dfab2d4c22c4aefc73cab008e42c02b0c763a95eb'),
    'llama-backprop-2gb': (1, None, 7989,
        '40ac4f80d975a4cf7e45f947e0f761c9527cf4972892918a0bea58f583c30e66'),
    'qwen-mebp-bf16-upcast-corrected': (
        318, 'lazy-ckpt1-ram-h-store-unshared-tile8M-mlpi256', 273,
        '81aa2f8b6683089b404d43c225547c3aac6f11dcec44f6861626ae494c297043'),
    'qwen-mebp-pixel8': (318, 'lazy-ckpt1-ram-h-store-shared-tile8M', 260,
        '9043c032257490f43fe878b591def7f016b10b87c657d8e8d9406f823a599f56'),
    'qwen3-mezo-iphone15': (18, 'mezo-lazy-tile8M', 220,
        'ac8ea3704dbaf27615bc348b88b59febee1cc233b30f3cd0cedb2102bfcf73d4'),
    'smollm-mebp-300mb-adamw-accum': (
        318, 'lazy-ckpt1-mmap-h-store-unshared-tile8M-mlpi192', 277,
        '3a519ce494a473a3ff98b75ab44dfa5d0e84e73fe09964e92dd412cecd8a1532'),
    'smollm-mebp-native-bf16-corrected-android': (
        318, 'resident131328K-nockpt-h-store-shared-tile8M', 223,
        '3b61ce47bcbb41ca57c1716a212ab5fe1cd86c61e66943bc5a73c66b5fa59993'),
    'tiny-mebp-requested-knobs': (1, None, 208,
        '114db460bcf34af887a30ab1c278409364c56365a3f4fe09e962afd11e90a0c7'),
}


def timed_run(ratio: float, matmul_s: float, decompress_s: float, dtype: str) -> dict:
    parts = {"matmul": matmul_s, "decompress": decompress_s, "elementwise": 0.1}
    modelled = sum(parts.values())
    return {"matmul_dtype": dtype, "ratio": ratio, "modelled_s": modelled,
            "measured_s": ratio * modelled, "modelled_parts": parts,
            "measured_parts": {"decompress": 1.3 * decompress_s}}


def corrected(host: HostCalibration) -> HostCalibration:
    """``host`` with what a few measured runs of each matmul dtype say."""
    runs = [timed_run(1.4, 2.0, 0.5, "float32"), {"matmul_dtype": "float32", "ratio": 0.9},
            timed_run(1.1, 0.5, 0.0, "float32"), timed_run(2.0, 1.0, 1.0, "float32")]
    native = [timed_run(1.6, 0.4, 0.3, "bfloat16"), timed_run(1.2, 3.0, 0.1, "bfloat16")]
    return replace(host, time_corrections={"float32": correction_from(runs, "float32"),
                                           "bfloat16": correction_from(native, "bfloat16")})


def case_plan(name: str, host: HostCalibration) -> Plan:
    """The case's plan over the configurations the recorded planner had (the grid has
    grown since: graph tails, the first k blocks resident at the no-checkpoint step, and
    direct reads of the store)."""
    model, fields, args = CASES[name]
    config = TrainConfig(**fields)
    workload = Workload.from_config(load_architecture(f"preset:{model}"), config)
    recorded_weights = frozen_weight_choices(workload)
    bf16_matmul = args.get("bf16_matmul", "auto")
    knobs = args.get("knobs") or [
        k for k in candidate_knobs(workload, host.threads, bf16_matmul)
        if k.graph_tail_blocks == 0 and k.store_reads == "mapped"
        and (k.frozen_weights, k.resident_weight_bytes) in recorded_weights]
    return make_plan(
        workload, corrected(host) if args.get("corrected") else host,
        budget_bytes=int(args["budget_mb"] * MB) if "budget_mb" in args else None,
        device=get_device(args["device"]) if "device" in args else None,
        margin=args.get("margin", 0.1), knobs=knobs, bf16_matmul=bf16_matmul)


# what plans say beyond the recorded planner, none of it a figure of the model: the peak a
# configuration must stay under (budget and margin, both recorded) and the recommendation
# (chosen from the recorded figures)
ADDED_SINCE = ("largest_fitting_peak_mb", "time_tolerance", "recommendation")
CALIBRATION_ADDED_SINCE = ("allocator",)  # what the plan says of its calibration
# knobs added since, each at its default in every recorded configuration
KNOBS_ADDED_SINCE = ("graph_tail_blocks", "mlp_intermediate_chunk", "store_reads")


def recorded_knobs(knobs: dict) -> dict:
    return {name: value for name, value in knobs.items() if name not in KNOBS_ADDED_SINCE}


def figures(plan: Plan) -> list:
    """Everything the plan says, at full precision (JSON writes a float's shortest exact
    repr)."""
    said = {key: value for key, value in plan.to_json().items() if key not in ADDED_SINCE}
    said["calibration"] = {key: value for key, value in said["calibration"].items()
                           if key not in CALIBRATION_ADDED_SINCE}
    said["configurations"] = [{**c, "knobs": recorded_knobs(c["knobs"])}
                              for c in said["configurations"]]
    return [said, [
        [e.id, e.method, recorded_knobs(e.knobs.model_dump(mode="json")), e.prediction.memory,
         e.prediction.time, e.prediction.modelled_time, e.prediction.store_bytes,
         e.prediction.checkpoint_file_bytes, dataclasses.asdict(e.prediction.device_work),
         e.device_step_time_s, e.feasible, e.reason, e.pareto] for e in plan.entries]]


def digest(plan: Plan) -> str:
    return hashlib.sha256(json.dumps(figures(plan), sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_figure_of_a_plan_is_what_the_unoptimized_planner_said(name, host):
    plan = case_plan(name, host)
    auto = None if plan.auto is None else plan.auto.id
    assert (len(plan.entries), auto, plan.smallest_budget_mb(), digest(plan)) == \
        tuple(RECORDED[name])


if __name__ == "__main__":  # prints RECORDED afresh, with the suite's host calibration
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[2]))
    from conftest import host as host_fixture

    fixed_host = host_fixture.__wrapped__()
    for case in sorted(CASES):
        made = case_plan(case, fixed_host)
        print(f"    {case!r}: ({len(made.entries)}, "
              f"{None if made.auto is None else made.auto.id!r}, "
              f"{made.smallest_budget_mb()},\n        {digest(made)!r}),")
