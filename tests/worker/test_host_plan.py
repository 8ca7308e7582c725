"""Every attempt of a job runs the configuration it was planned with, at the attempt's own
threads, predicted again with this host's calibration; it is planned afresh only where it is
predicted not to fit the budget here, and the job says so. A configuration the request named
is kept, a job of another method keeps its knobs, and a bf16 path of "auto" is fixed by the
first attempt."""

from __future__ import annotations

import json

import pytest
from database_rows import database_with_dataset
from sqlmodel import Session, select

from mebp_core.config import EngineKnobs, TrainConfig
from mebp_core.cpu import native_bf16_matmul
from mebp_core.plan.arch import load_architecture
from mebp_core.plan.calibration import calibration_path
from mebp_core.plan.on_host import plan_on_host, plan_summary
from mebp_core.plan.planner import knobs_id
from mebp_core.plan.summary import PlanSummary
from mebp_core.units import MB
from service.job_plan import UnplannedJob
from service.models import Event, Job
from service.settings import Settings
from worker.host_plan import plan_on_this_worker

MODEL = "preset:qwen2.5-0.5b"
BUDGET = 400 * MB


@pytest.fixture
def session(tmp_path):
    engine = database_with_dataset(tmp_path, rows=1)
    with Session(engine) as session:
        yield session
    engine.dispose()


@pytest.fixture
def settings(tmp_path, seed_calibration) -> Settings:
    """A worker at one thread, calibrated for it."""
    cache = seed_calibration(tmp_path / "cache", threads=1)
    return Settings(data_dir=tmp_path, cache_dir=cache, threads=1)


def job_with(session: Session, config: TrainConfig,
             plan: PlanSummary | UnplannedJob | dict) -> Job:
    job = Job(id="j1", tenant="t", status="running", model=MODEL, memory_budget_bytes=BUDGET,
              config=config.model_dump(mode="json"), plan=plan, training_file="d1")
    session.add(job)
    session.commit()
    return job


def this_hosts_plan(settings: Settings, config: TrainConfig):
    here = config.model_copy(update={"knobs": config.knobs.model_copy(update={"threads": 1})})
    return plan_on_host(load_architecture(MODEL), here, budget_bytes=BUDGET,
                        cache_dir=settings.cache_dir, measure=False)


def recorded(settings: Settings, config: TrainConfig, *, chosen_by: str = "auto",
             budget_bytes: int = BUDGET) -> PlanSummary:
    """The plan record of a job planned (elsewhere, under ``budget_bytes``) to run
    ``config``'s knobs."""
    here = config.model_copy(update={"knobs": config.knobs.model_copy(update={"threads": 1})})
    plan = plan_on_host(load_architecture(MODEL), here, budget_bytes=budget_bytes,
                        candidates=[here.knobs], cache_dir=settings.cache_dir, measure=False)
    return plan_summary(plan, plan.entries[0], chosen_by=chosen_by)


UNPLANNED = UnplannedJob(planned=False, reason="the planner models method mebp, not mezo")


def test_a_planned_job_keeps_its_configuration_where_it_fits(session, settings):
    """Planned with a configuration this host would not pick (the smallest), the job runs it
    still, at this worker's threads, with this host's predictions of it."""
    as_submitted = TrainConfig(seq_len=256)
    plan = this_hosts_plan(settings, as_submitted)
    kept = plan.smallest
    assert kept.id != plan.auto.id  # this host alone would have run another one
    job = job_with(session, as_submitted.model_copy(update={"knobs": kept.knobs.model_copy(
        update={"threads": None})}), plan_summary(plan, kept, chosen_by="auto"))
    config = plan_on_this_worker(session, job, job.train_config(), MODEL, settings, "w1")
    session.commit()

    assert config.knobs == kept.knobs.model_copy(update={"threads": 1})
    session.refresh(job)
    assert job.train_config() == config
    assert job.plan.configuration == kept.id and job.plan.predicted_by == "w1"
    assert job.plan.predicted_peak_mb == round(kept.prediction.peak_bytes / MB, 1)
    assert job.plan.calibration["threads"] == 1 and job.plan.replanned is None
    assert "replanned" not in job.plan.model_dump(mode="json")
    assert session.exec(select(Event).where(Event.job_id == job.id)).all() == []


def test_a_configuration_that_does_not_fit_here_is_planned_again_and_kept_after(session,
                                                                             settings):
    """Every weight resident fitted where the job was planned, not in 400 MB here: this
    attempt runs this host's fastest that fits, says why, and the next attempt keeps it."""
    everything = TrainConfig(seq_len=256, knobs=EngineKnobs(frozen_weights="resident"))
    where_planned = recorded(settings, everything, budget_bytes=4096 * MB)
    assert where_planned.feasible
    job = job_with(session, everything, where_planned)
    config = plan_on_this_worker(session, job, job.train_config(), MODEL, settings, "w1")
    session.commit()

    fastest = this_hosts_plan(settings, TrainConfig(seq_len=256)).auto
    assert config.knobs == fastest.knobs.model_copy(update={"threads": 1})
    replanned = job.plan.replanned
    assert replanned.previous_configuration == knobs_id(everything.knobs)
    assert replanned.worker == "w1" and replanned.attempt == job.attempts
    assert "predicted not to fit here: needs" in replanned.reason
    assert job.plan.configuration == fastest.id and job.plan.predicted_peak_mb * 1.1 <= 400
    events = session.exec(select(Event).where(Event.job_id == job.id)).all()
    assert [e.data["previous_configuration"] for e in events] == [knobs_id(everything.knobs)]
    assert events[0].data["configuration"] == fastest.id

    job.attempts += 1  # resumed by another worker of this host: nothing changes
    again = plan_on_this_worker(session, job, job.train_config(), MODEL, settings, "w2")
    assert again == config and job.plan.replanned == replanned
    assert len(session.exec(select(Event).where(Event.job_id == job.id)).all()) == 1


def test_a_configuration_the_request_named_is_kept_with_this_workers_threads(session,
                                                                             settings):
    requested = TrainConfig(seq_len=256, knobs=EngineKnobs(checkpoint_blocks=2, threads=7))
    job = job_with(session, requested, recorded(settings, requested, chosen_by="request"))
    config = plan_on_this_worker(session, job, job.train_config(), MODEL, settings, "w1")
    assert config.knobs == requested.knobs.model_copy(update={"threads": 1})
    assert job.plan.chosen_by == "request" and job.plan.predicted_by == "w1"
    assert job.plan.configuration == knobs_id(requested.knobs)


def test_a_mezo_job_is_predicted_again_with_mezos_own_model(session, settings):
    planned = this_hosts_plan(settings, TrainConfig(method="mezo", seq_len=256))
    recorded = plan_summary(planned, planned.auto, chosen_by="auto")
    job = job_with(session, TrainConfig(method="mezo", seq_len=256,
                                        knobs=planned.auto.knobs), recorded)
    config = plan_on_this_worker(session, job, job.train_config(), MODEL, settings, "w1")
    assert config.method == "mezo" and config.knobs.frozen_weights == \
        planned.auto.knobs.frozen_weights
    assert job.plan.method == "mezo" and job.plan.configuration == planned.auto.id
    assert job.plan.predicted_by == "w1" and job.plan.predicted_memory_mb["checkpoints"] == 0


def test_a_job_recorded_unplanned_keeps_its_knobs(session, settings):
    """A row written before every method was planned loads, and keeps its record."""
    job = job_with(session, TrainConfig(method="mezo", seq_len=256),
                   UNPLANNED.model_dump(mode="json"))
    config = plan_on_this_worker(session, job, job.train_config(), MODEL, settings, "w1")
    session.commit()
    session.refresh(job)
    assert config.method == "mezo" and config.knobs.threads == 1
    assert job.plan == UNPLANNED and job.planned() is None


def test_a_bf16_path_of_auto_is_fixed_by_the_first_attempt(session, settings):
    """The path this host's CPU takes for "auto" is written into the job's config, so a
    later attempt on a CPU that would take the other runs the same matmuls."""
    job = job_with(session, TrainConfig(method="backprop", compute_dtype="bfloat16"),
                   UNPLANNED)
    config = plan_on_this_worker(session, job, job.train_config(), MODEL, settings, "w1")
    assert config.knobs.bf16_matmul == ("native" if native_bf16_matmul() else "float32")
    assert job.train_config().knobs.bf16_matmul == config.knobs.bf16_matmul


def test_without_a_thread_setting_a_job_takes_the_cores_free_as_it_starts(
        session, tmp_path, seed_calibration, all_cores_but_one_busy):
    """Every core but one kept busy: the job runs one thread, planned with this host's
    one-thread calibration, and says so."""
    cache = seed_calibration(tmp_path / "cache", threads=1)
    settings = Settings(data_dir=tmp_path, cache_dir=cache)  # threads unset
    config = TrainConfig(seq_len=256)
    job = job_with(session, config, recorded(settings, config, chosen_by="request"))
    config = plan_on_this_worker(session, job, config, MODEL, settings, "w1")
    session.commit()
    assert config.knobs.threads == 1 and job.train_config().knobs.threads == 1
    assert job.plan.calibration["threads"] == 1 and job.plan.predicted_by == "w1"
    told = [e.data for e in session.exec(select(Event).where(Event.job_id == job.id)).all()
            if "idle_cores" in e.data]
    assert [e["threads"] for e in told] == [1] and told[0]["idle_cores"] <= 1.2


def test_a_job_never_waits_on_its_host_being_measured_again(session, settings):
    """An unsteady calibration due to be measured again (a busy host) plans the job as it
    is: measuring again takes minutes at the load that made it unsteady, and a job's worker
    planning inside its lease (with its database write open) would miss its heartbeats."""
    path = calibration_path(settings.cache_dir, 1)
    unsteady = {**json.loads(path.read_text()), "spread": {"matmul": 75.0},
                "measured_at": "2026-01-01T00:00:00+00:00", "retried_at": None}
    path.write_text(json.dumps(unsteady))
    config = TrainConfig(seq_len=256)
    job = job_with(session, config, recorded(settings, config))
    plan_on_this_worker(session, job, job.train_config(), MODEL, settings, "w1")
    assert json.loads(path.read_text()) == unsteady  # not measured, nor marked tried
    assert job.planned().calibration["steady"] is False
