"""The host's step-time correction: the median of its latest runs' measured/modelled ratios,
per matmul dtype and per calibration, applied by every plan made with that calibration."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import mebp_core
from mebp_core.config import EngineKnobs
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.calibration import calibration_path, load_calibration
from mebp_core.plan.correction import (
    RECENT_RUNS,
    correction_from,
    correction_path,
    measured_step_time,
    record_run,
)
from mebp_core.plan.predict import predict
from mebp_core.plan.workload import Workload


def record(cache, at: str, ratio: float, dtype: str = "float32"):
    return record_run(calibration_path(cache, None), at, matmul_dtype=dtype, modelled_s=2.0,
                      measured_s=2.0 * ratio, label="test")


def test_a_run_is_its_steps_after_the_first():
    assert measured_step_time([9.0, 1.0, 3.0, 2.0]) == 2.0
    assert measured_step_time([9.0]) is None


def test_the_correction_is_the_median_of_the_latest_runs_per_dtype(tmp_path, seed_calibration,
                                                                    host):
    cache = seed_calibration(tmp_path)
    at = host.measured_at
    assert load_calibration(cache).time_corrections == {}
    assert record(cache, at, 3.0).factor == pytest.approx(3.0)
    ratios = [3.0, 1.0, 1.2, 1.1, 0.9, 1.3]  # the first falls out of the window
    for ratio in ratios[1:]:
        correction = record(cache, at, ratio)
    assert correction.runs == RECENT_RUNS
    assert correction.factor == pytest.approx(1.1)
    record(cache, at, 0.5, dtype="bfloat16")
    loaded = load_calibration(cache)
    assert loaded.time_corrections["float32"].factor == pytest.approx(1.1)
    assert loaded.time_corrections["bfloat16"].factor == pytest.approx(0.5)
    assert record(cache, at, 1000.0) is None  # not a statement about the host

    # every plan's step time moves by the factor; memory does not
    workload = Workload(arch=load_architecture("preset:tiny"), seq_len=64)
    plain = predict(workload, EngineKnobs(), host)
    corrected = predict(workload, EngineKnobs(), loaded)
    assert corrected.step_time_s == pytest.approx(plain.step_time_s * 1.1)
    assert corrected.modelled_step_time_s == pytest.approx(plain.step_time_s)
    assert corrected.memory == plain.memory


def test_a_new_calibration_starts_uncorrected_and_a_corrupt_record_is_ignored(
        tmp_path, seed_calibration, host):
    cache = seed_calibration(tmp_path)
    record(cache, "2026-01-01T00:00:00+00:00", 2.0)  # runs against an earlier calibration
    assert load_calibration(cache).time_corrections == {}
    correction_path(calibration_path(cache, None)).write_text("{not json")
    assert load_calibration(cache).time_corrections == {}
    assert record(cache, host.measured_at, 2.0).runs == 1
    assert json.loads(correction_path(calibration_path(cache, None)).read_text())[0]["ratio"] == 2.0


def run(matmul_s: float, decompress_s: float, *, slow_decompress: float,
        timed: bool = True) -> dict:
    """A run on a host whose decompression is ``slow_decompress`` times what was modelled
    and whose matmuls are 1.2 times; the engine timed its decompression (``timed``)."""
    measured = 1.2 * matmul_s + slow_decompress * decompress_s
    modelled = matmul_s + decompress_s
    return {"ratio": measured / modelled, "measured_s": measured, "modelled_s": modelled,
            "modelled_parts": {"matmul": matmul_s, "decompress": decompress_s, "disk": 0.0},
            **({"measured_parts": {"decompress": slow_decompress * decompress_s}}
               if timed else {})}


def test_part_factors_find_the_part_the_host_is_slow_at():
    """Lazy (decompression-heavy) and resident configurations on a host whose decompression
    is 3x slower than calibrated: one factor cannot fit both; the timed part and the rest
    of the step each get their own."""
    mixes = [(1.0, 2.0), (3.0, 0.1), (1.0, 1.0), (2.0, 0.2), (1.0, 3.0), (4.0, 0.0)]
    runs = [run(m, d, slow_decompress=3.0) for m, d in mixes]
    correction = correction_from(runs, "float32")
    truth = run(1.0, 1.0, slow_decompress=3.0)  # planned again, as measured
    parts = correction.part_factors(truth["modelled_parts"])
    assert parts["decompress"] == pytest.approx(3.0) and parts["matmul"] == pytest.approx(1.2)
    assert correction.timed_runs == len(runs)

    def error(time_factor_of) -> float:
        predicted = sum(time_factor_of(p) * s for p, s in truth["modelled_parts"].items())
        return abs(predicted / truth["measured_s"] - 1)
    assert error(parts.__getitem__) == pytest.approx(0.0, abs=1e-9)
    assert error(lambda p: correction.factor) > 0.2


def test_a_configuration_is_corrected_by_the_runs_most_like_it():
    """A host where the rest of a lazy configuration's step (decompressing in tiles) runs
    1.5x its model and a resident one's 1.0x, as measured for bfloat16 on a Xeon with AMX:
    each family is corrected by its own runs, whichever ran last."""
    def family_run(matmul_s: float, decompress_s: float) -> dict:
        lazy = decompress_s > 0
        measured = (1.5 if lazy else 1.0) * matmul_s + 1.2 * decompress_s
        return {"ratio": measured / (matmul_s + decompress_s), "measured_s": measured,
                "modelled_s": matmul_s + decompress_s,
                "modelled_parts": {"matmul": matmul_s, "decompress": decompress_s},
                "measured_parts": {"decompress": 1.2 * decompress_s}}
    runs = [family_run(2.0, 1.0), family_run(1.0, 0.0), family_run(2.0, 1.0),
            family_run(1.0, 0.0)]
    correction = correction_from(runs, "float32")
    for matmul_s, decompress_s in ((2.0, 1.0), (1.0, 0.0)):
        truth = family_run(matmul_s, decompress_s)
        predicted = sum(correction.apply(truth["modelled_parts"]).values())
        assert predicted == pytest.approx(truth["measured_s"])
    assert 1.0 < correction.factor < 1.5  # the prior alone fits neither


def test_runs_far_from_a_configuration_correct_it_less():
    """A run of a model ten times smaller (its step overhead-bound, 2x its model) says
    little of a large model's step of the same mix: the large one's plan moves toward 2x
    only part of the way; a run of its own size moves it all the way. Its timed
    decompression is the host's dequantization rate against the calibration, whatever the
    size, so a run of the same mix corrects that part fully and one of another mix less."""
    def sized_run(scale: float, ratio: float, decompress_s: float = 1.0) -> dict:
        parts = {"matmul": 3.0 * scale, "decompress": decompress_s * scale}
        modelled = sum(parts.values())
        return {"ratio": ratio, "measured_s": ratio * modelled, "modelled_s": modelled,
                "modelled_parts": parts,
                "measured_parts": {"decompress": ratio * decompress_s * scale}}
    large = sized_run(10.0, 2.0)["modelled_parts"]
    far = correction_from([sized_run(1.0, 2.0)], "float32").part_factors(large)
    near = correction_from([sized_run(10.0, 2.0)], "float32").part_factors(large)
    assert near == pytest.approx({"matmul": 2.0, "decompress": 2.0})
    assert 1.0 < far["matmul"] < 1.2 and far["decompress"] == pytest.approx(2.0)
    closer = correction_from([sized_run(5.0, 2.0)], "float32").part_factors(large)
    assert far["matmul"] < closer["matmul"] < near["matmul"]
    other_mix = correction_from([sized_run(10.0, 2.0, decompress_s=9.0)], "float32")
    assert 1.0 < other_mix.part_factors(large)["decompress"] < 2.0


def test_a_part_too_small_to_time_takes_the_rest_of_the_steps_factor():
    resident = correction_from([run(4.0, 0.01, slow_decompress=10.0)], "float32")
    assert resident.factor == pytest.approx((4.8 + 0.1) / 4.01)
    assert resident.part_factors({"matmul": 4.0, "decompress": 0.01}) == {
        "matmul": pytest.approx(1.2), "decompress": pytest.approx(1.2)}
    # runs recorded without timed parts (older records) give the prior alone
    untimed = correction_from([run(1.0, 1.0, slow_decompress=2.0, timed=False)], "float32")
    assert untimed.part_factors({"matmul": 1.0}) == {} and untimed.timed_runs == 0


def test_a_jobs_timed_decompression_is_recorded_with_its_run(tmp_path, seed_calibration, host):
    cache = seed_calibration(tmp_path)
    correction = record_run(calibration_path(cache, None), host.measured_at,
                            matmul_dtype="float32", modelled_s=2.0, measured_s=5.0,
                            label="test", modelled_parts={"matmul": 1.0, "decompress": 1.0},
                            measured_parts={"decompress": 3.0, "matmul": 9.0})
    assert correction.part_factors({"matmul": 1.0, "decompress": 1.0}) == {
        "matmul": pytest.approx(2.0), "decompress": pytest.approx(3.0)}
    [kept] = json.loads(correction_path(calibration_path(cache, None)).read_text())
    assert kept["measured_parts"] == {"decompress": 3.0}  # only what the engine times


def test_runs_of_another_checkout_never_correct_this_ones_plans(tmp_path, seed_calibration,
                                                                host):
    """Another checkout of the engine (one line of its training step changed) shares this
    host's cache and calibration, but not its correction."""
    cache = seed_calibration(tmp_path / "cache")
    other = tmp_path / "other-checkout"
    shutil.copytree(Path(mebp_core.__file__).parent, other / "mebp_core",
                    ignore=shutil.ignore_patterns("__pycache__", "shipped"))
    with open(other / "mebp_core" / "engine" / "mebp.py", "a") as f:
        f.write("\n# another version of the training step\n")
    script = (
        "import json, sys, mebp_core\n"
        "from pathlib import Path\n"
        "from mebp_core.plan.calibration import calibration_path, load_calibration\n"
        "from mebp_core.plan.correction import record_run\n"
        "cache = Path(sys.argv[1])\n"
        "record_run(calibration_path(cache, None), sys.argv[2], matmul_dtype='float32',\n"
        "           modelled_s=2.0, measured_s=6.0, label='other checkout')\n"
        "factor = load_calibration(cache, measure=False).time_corrections['float32'].factor\n"
        "print(json.dumps({'package': mebp_core.__file__, 'factor': factor,\n"
        "                  'calibration': str(calibration_path(cache, None))}))\n")
    done = subprocess.run([sys.executable, "-c", script, str(cache), host.measured_at],
                          capture_output=True, text=True, timeout=120, cwd=other,
                          env={**os.environ, "PYTHONPATH": str(other)})
    assert done.returncode == 0, done.stderr
    ran = json.loads(done.stdout)
    assert Path(ran["package"]).is_relative_to(other)  # the other code ran
    assert ran["factor"] == pytest.approx(3.0)  # and learned from its own run
    # the same calibration (its figures are the hardware's) ...
    assert ran["calibration"] == str(calibration_path(cache, None))
    # ... but this checkout's plans are not corrected by the other's run
    assert load_calibration(cache).time_corrections == {}
    assert record(cache, host.measured_at, 1.5).factor == pytest.approx(1.5)
