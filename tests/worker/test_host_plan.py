"""The worker plans each job again on its own host: its threads, its calibration and the
configuration that calibration predicts fastest within the job's budget; a configuration
the request named is kept, and a job of another method keeps its knobs."""

from __future__ import annotations

import pytest
from sqlmodel import Session, select

from mebp_core.config import EngineKnobs, TrainConfig
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.on_host import fastest_fitting, plan_on_host
from mebp_core.units import MB
from service.db import database_url, make_engine, upgrade_database
from service.models import Dataset, Event, Job
from service.settings import Settings
from worker.host_plan import plan_on_this_worker

MODEL = "preset:qwen2.5-0.5b"
BUDGET = 400 * MB


@pytest.fixture
def session(tmp_path):
    url = database_url(None, tmp_path)
    upgrade_database(url)
    engine = make_engine(url)
    with Session(engine) as session:
        session.add(Dataset(id="d1", tenant="t", filename="d.jsonl", path="/dev/null", bytes=0,
                            rows=1, sha256="0" * 64))
        session.commit()
        yield session
    engine.dispose()


@pytest.fixture
def settings(tmp_path, seed_calibration) -> Settings:
    """A worker at one thread, calibrated for it."""
    cache = seed_calibration(tmp_path / "cache", threads=1)
    return Settings(data_dir=tmp_path, cache_dir=cache, threads=1)


def job_with(session: Session, config: TrainConfig, plan: dict) -> Job:
    job = Job(id="j1", tenant="t", status="running", model=MODEL, memory_budget_bytes=BUDGET,
              config=config.model_dump(mode="json"), plan=plan, training_file="d1")
    session.add(job)
    session.commit()
    return job


def test_a_planned_job_takes_this_hosts_fastest_fitting_configuration(session, settings):
    as_submitted = TrainConfig(seq_len=256, knobs=EngineKnobs(frozen_weights="resident"))
    job = job_with(session, as_submitted, {"planned": True, "chosen_by": "auto",
                                           "configuration": "planned-elsewhere"})
    config = plan_on_this_worker(session, job, MODEL, settings, "w1")
    session.commit()

    here = as_submitted.model_copy(update={"knobs": EngineKnobs(threads=1)})
    expected = fastest_fitting(plan_on_host(load_architecture(MODEL), here,
                                            budget_bytes=BUDGET, cache_dir=settings.cache_dir,
                                            measure=False), here)
    assert config == expected and config.knobs.threads == 1
    assert config.knobs.frozen_weights != "resident"  # the whole model does not fit 400 MB
    session.refresh(job)
    assert job.train_config() == config
    assert job.plan["planned_by"] == "w1" and job.plan["chosen_by"] == "auto"
    assert job.plan["predicted_peak_mb"] * 1.1 <= 400
    events = session.exec(select(Event).where(Event.job_id == job.id)).all()
    assert [e.data["previous_configuration"] for e in events] == ["planned-elsewhere"]


def test_a_configuration_the_request_named_is_kept_with_this_workers_threads(session,
                                                                             settings):
    requested = EngineKnobs(checkpoint_blocks=2, threads=7)
    job = job_with(session, TrainConfig(seq_len=256, knobs=requested),
                   {"planned": True, "chosen_by": "request", "configuration": "x"})
    config = plan_on_this_worker(session, job, MODEL, settings, "w1")
    assert config.knobs == requested.model_copy(update={"threads": 1})
    assert job.plan["chosen_by"] == "request" and job.plan["planned_by"] == "w1"


def test_another_methods_knobs_are_kept(session, settings):
    job = job_with(session, TrainConfig(method="mezo", seq_len=256),
                   {"planned": False, "reason": "the planner models method mebp"})
    config = plan_on_this_worker(session, job, MODEL, settings, "w1")
    assert config.method == "mezo" and config.knobs.threads == 1
    assert job.plan == {"planned": False, "reason": "the planner models method mebp"}


def test_a_job_planned_with_this_workers_own_calibration_is_not_planned_again(session,
                                                                              settings):
    """The API on the same host (one `mebp serve`) planned with the same calibration and
    threads: its plan stands, only the threads are the worker's."""
    from mebp_core.plan.calibration import load_calibration

    mine = load_calibration(settings.cache_dir, settings.threads).provenance()
    as_planned = TrainConfig(seq_len=256, knobs=EngineKnobs(checkpoint_blocks=2))
    plan = {"planned": True, "chosen_by": "auto", "configuration": "kept",
            "calibration": mine}
    job = job_with(session, as_planned, plan)
    config = plan_on_this_worker(session, job, MODEL, settings, "w1")
    assert config.knobs == as_planned.knobs.model_copy(update={"threads": 1})
    assert job.plan == plan
    other = {**mine, "measured_at": "2020-01-01T00:00:00+00:00"}  # another calibration
    job.plan = {**plan, "calibration": other}
    plan_on_this_worker(session, job, MODEL, settings, "w1")
    assert job.plan["planned_by"] == "w1" and job.plan["configuration"] != "kept"


def test_without_a_thread_setting_a_job_takes_the_cores_free_as_it_starts(
        session, tmp_path, seed_calibration, all_cores_but_one_busy):
    """Every core but one kept busy: the job runs one thread, planned with this host's
    one-thread calibration, and says so."""
    cache = seed_calibration(tmp_path / "cache", threads=1)
    settings = Settings(data_dir=tmp_path, cache_dir=cache)  # threads unset
    job = job_with(session, TrainConfig(seq_len=256), {"planned": True, "chosen_by": "auto",
                                                         "configuration": "planned-elsewhere"})
    config = plan_on_this_worker(session, job, MODEL, settings, "w1")
    session.commit()
    assert config.knobs.threads == 1 and job.train_config().knobs.threads == 1
    assert job.plan["calibration"]["threads"] == 1 and job.plan["planned_by"] == "w1"
    told = [e.data for e in session.exec(select(Event).where(Event.job_id == job.id)).all()
            if "idle_cores" in e.data]
    assert [e["threads"] for e in told] == [1] and told[0]["idle_cores"] <= 1.2
