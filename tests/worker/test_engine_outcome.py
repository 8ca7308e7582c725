"""How a worker records its engine's end, on a prepared job folder and a real SQLite
database: a finished job's end waits on no lock while it holds a write of the database, nor
for long on a lock whose holder hangs, and its measured time is recorded once in this host's
time correction, however often an attempt records it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from database_rows import database_with_dataset
from hung_lock import finishes, held_by_a_hung_process
from sqlite_writers import assert_no_write_held_while_waiting
from sqlmodel import Session, select
from waiting import HANG_GUARD_S

from mebp_core.atomic import exclusive_lock
from mebp_core.config import EngineKnobs, TrainConfig
from mebp_core.lora.peft_files import ADAPTER_FILES
from mebp_core.plan import correction as time_correction
from mebp_core.plan.calibration import calibration_path, load_calibration
from mebp_core.plan.correction import correction_path
from mebp_core.plan.summary import PlanSummary
from service.models import Event, Job
from service.settings import Settings
from service.storage import job_dir
from worker.child import ADAPTER
from worker.engine_files import EngineFinished, EngineRequest, write_result
from worker.engine_outcome import record_outcome
from worker.measured_time import correct_host_time
from worker.memory_cap import RlimitCap

JOB = "job-outcome"


@pytest.fixture
def cache(tmp_path, seed_calibration) -> Path:
    return seed_calibration(tmp_path / "cache", threads=1)


@pytest.fixture
def engine(tmp_path, cache):
    """A running job planned against this host's calibration, whose engine has finished
    (its adapter and result written) with its steps measured at 0.75 s, 1.5x its model."""
    engine = database_with_dataset(tmp_path, rows=0)
    calibration = load_calibration(cache, 1, measure=False).provenance()
    plan = PlanSummary(
        configuration="c1", feasible=True, budget_mb=1024.0, margin=0.1,
        matmul_dtype="float32", predicted_peak_mb=100.0, predicted_memory_mb={"weights": 100.0},
        predicted_step_time_s=0.5, modelled_step_time_s=0.5, modelled_time_s={"matmul": 0.5},
        smallest_budget_mb=111, smallest_configuration="c1", dominant_component="weights",
        calibration=calibration)
    with Session(engine) as session:
        session.add(Job(id=JOB, tenant="t", status="running", model="preset:tiny",
                        memory_budget_bytes=1 << 30, config={}, plan=plan,
                        training_file="d1", step=4, step_time_s=0.75))
        session.commit()
    folder = job_dir(tmp_path / "storage", JOB)
    (folder / ADAPTER).mkdir(parents=True)
    for name in ADAPTER_FILES:
        (folder / ADAPTER / name).write_text(f"{name} of step 4")
    write_result(folder, EngineFinished(status="succeeded", steps=4, final_loss=0.5,
                                        peak_mb=100.0, peak_anon_mb=90.0, footprint_mb=120.0,
                                        memory_method="pss"))
    yield engine
    engine.dispose()


def record(engine, tmp_path: Path, cache: Path) -> None:
    """The worker's record of the job's end, as ``_run_capped`` makes it."""
    settings = Settings(data_dir=tmp_path, cache_dir=cache)
    request = EngineRequest(config=TrainConfig(knobs=EngineKnobs(threads=1)),
                            model="preset:tiny", model_dir=tmp_path, data=Path("/dev/null"),
                            keep_checkpoints=True)
    with Session(engine) as session:
        record_outcome(session, session.get(Job, JOB), job_dir(settings.storage_root, JOB),
                       0, RlimitCap(None), request, settings, [])


def test_a_job_end_waiting_on_the_time_corrections_lock_holds_no_write(engine, tmp_path,
                                                                       cache, monkeypatch):
    """Another worker records its job's time in this host's correction (or hung doing so,
    stopped as a test's SIGSTOP leaves it): this job's end waits for its lock, and
    meanwhile every other writer of the one SQLite file (the reconciler, the API, this
    job's heartbeat) goes on, rather than waiting behind it until it fails."""
    monkeypatch.setattr(time_correction, "RECORD_WAIT_S", HANG_GUARD_S)  # waits throughout
    lock = correction_path(calibration_path(cache, 1)).with_suffix(".lock")
    failed: list[BaseException] = []

    def end() -> None:
        try:
            record(engine, tmp_path, cache)
        except BaseException as exc:  # noqa: BLE001  (reported by the test's thread)
            failed.append(exc)

    with exclusive_lock(lock):
        ending = threading.Thread(target=end)
        assert_no_write_held_while_waiting(ending, lock, tmp_path / "mebp.db")
    ending.join()
    assert failed == []
    with Session(engine) as session:
        assert session.get(Job, JOB).status == "succeeded"
        said = session.exec(select(Event.message).where(Event.kind == "log")).all()
    assert [message[:33] for message in said] == ["measured 0.75 s/step against 0.5 "]
    correction = load_calibration(cache, 1, measure=False).time_corrections["float32"]
    assert correction.runs == 1 and correction.factor == pytest.approx(1.5)


def test_a_job_end_whose_correction_recorder_hangs_ends_without_recording(
        engine, tmp_path, cache, monkeypatch):
    """Another worker hung (stopped, never to go on) while it recorded its job's time,
    holding this host's correction's lock for good: this job still ends, after
    ``RECORD_WAIT_S``, saying its time was not recorded, and the correction is unchanged."""
    monkeypatch.setattr(time_correction, "RECORD_WAIT_S", 0.5)
    lock = correction_path(calibration_path(cache, 1)).with_suffix(".lock")
    with held_by_a_hung_process(lock) as holder:
        _, waited_s = finishes(lambda: record(engine, tmp_path, cache))
        assert holder.poll() is None  # it held the lock throughout
    assert waited_s >= 0.5
    with Session(engine) as session:
        assert session.get(Job, JOB).status == "succeeded"
        said = session.exec(select(Event.message).where(Event.kind == "log")).all()
    assert len(said) == 1 and "not recorded in this host's time correction" in said[0] \
        and str(lock) in said[0], said
    assert "float32" not in load_calibration(cache, 1, measure=False).time_corrections


def test_a_job_end_recorded_again_counts_its_time_once(engine, tmp_path, cache):
    """An attempt recorded its job's time (at 1.0 s a step), then its worker died before it
    committed the job's end; the job ran again and its next attempt's end replaces that
    record rather than adding a second run of the same job."""
    with Session(engine) as session:
        lost = session.get(Job, JOB)
        lost.step_time_s = 1.0  # the lost attempt's measurement, never committed
        assert correct_host_time(lost, cache_dir=cache, threads=1) is not None
    record(engine, tmp_path, cache)
    correction = load_calibration(cache, 1, measure=False).time_corrections["float32"]
    assert correction.runs == 1 and correction.factor == pytest.approx(1.5)
