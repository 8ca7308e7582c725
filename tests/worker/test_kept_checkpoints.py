"""What a worker does with the adapters a job's engine kept, on a prepared job folder: an
attempt resuming from step R keeps what its predecessor recorded up to R, records what was
kept but not recorded since, and removes what was pruned but not yet removed, what it trains
again, and what a kill left half written or half removed; pruning never touches the job's
final adapter; a kept adapter that cannot be recorded ends the job with its engine; a resume
that waits on a kept adapter's lock holds no write of the database meanwhile, and waits a
bounded time on a holder that hangs."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest
from database_rows import database_with_dataset
from hung_lock import finishes, held_by_a_hung_process
from sqlite_writers import assert_no_write_held_while_waiting
from sqlmodel import Session, select
from waiting import HANG_GUARD_S

from mebp_core.atomic import exclusive_lock
from mebp_core.engine.kept_adapters import kept_adapter_dir
from mebp_core.lora.peft_files import ADAPTER_FILES
from service import adapter_downloads
from service.job_checkpoints import checkpoint_id
from service.models import Event, Job, JobCheckpoint, Metric
from service.settings import Settings
from service.storage import adapter_downloads_dir, job_dir, kept_digest, sha256_file
from worker.child import ADAPTER, CHECKPOINT, KEPT
from worker.kept_checkpoints import remove_folders
from worker.runner import JobRun

JOB = "job-kept"


@pytest.fixture
def engine(tmp_path):
    engine = database_with_dataset(tmp_path, rows=0)
    with Session(engine) as session:
        session.add(Job(id=JOB, tenant="t", status="running", model="preset:tiny",
                        memory_budget_bytes=1 << 30, config={}, training_file="d1"))
        session.commit()
    yield engine
    engine.dispose()


@pytest.fixture
def run(tmp_path, engine) -> JobRun:
    return JobRun(Settings(data_dir=tmp_path, max_checkpoints_per_job=3), engine, JOB)


def keep(run: JobRun, *steps: int) -> None:
    """The engine kept these steps' adapters (each step's metrics line is recorded)."""
    for step in steps:
        folder = kept_adapter_dir(run.dir / KEPT, step)
        folder.mkdir(parents=True)
        for name in ADAPTER_FILES:
            (folder / name).write_text(f"{name} of step {step}")


def prepare(run: JobRun, engine, *, resume_from: int, recorded: list[int],
            on_disk: list[int], last_step: int) -> None:
    """A job folder an earlier attempt left: its checkpoint at ``resume_from``, metrics up to
    ``last_step``, the kept adapters ``on_disk`` of which ``recorded`` have rows."""
    (run.dir / CHECKPOINT).mkdir(parents=True)
    (run.dir / CHECKPOINT / "state.json").write_text(json.dumps({"step": resume_from}))
    keep(run, *on_disk)
    with Session(engine) as session:
        for step in range(1, last_step + 1):
            session.add(Metric(job_id=JOB, step=step, loss=step / 100))
        session.commit()
        run.kept = set()
        run._record_kept(session, session.get(Job, JOB), recorded)
        assert rows(session) == recorded[-3:]


def rows(session: Session) -> list[int]:
    return sorted(session.exec(select(JobCheckpoint.step)).all())


def left(run: JobRun) -> list[str]:
    return sorted(path.name for path in (run.dir / KEPT).iterdir())


def resume(run: JobRun, engine) -> list[int]:
    with Session(engine) as session:
        run._resume_point(session, session.get(Job, JOB))
        return rows(session)


def test_a_resume_does_not_record_again_what_was_pruned(run, engine):
    """Killed after pruning step 15's row (as 30 was recorded) and before removing its
    folder, and before the engine saved step 30's state: the resume from 25 records none
    of the older folders again, and removes them with step 30's (trained again)."""
    prepare(run, engine, resume_from=25, recorded=[15, 20, 25, 30],
            on_disk=[15, 20, 25, 30], last_step=30)
    keep(run, 15)  # its folder, as the kill left it
    (run.dir / KEPT / ".step-10.trash-0a1b").mkdir()  # a removal cut short
    assert resume(run, engine) == [20, 25]
    assert left(run) == ["step-20", "step-20-downloads", "step-25", "step-25-downloads"]
    with Session(engine) as session:
        kinds = session.exec(select(Event.data).where(Event.kind == "checkpoint")).all()
    assert [data["step"] for data in kinds] == [15, 20, 25, 30]  # none again


def test_a_resume_drops_the_steps_it_trains_again_and_records_the_lost_ones(run, engine):
    """Killed after the engine kept step 15 but before it saved step 15's state, with step
    20's being written: the resume from 10 records step 10 (kept, not yet recorded), drops
    15 and the half-written 20; the engine keeps 15 anew, recorded under the same id."""
    prepare(run, engine, resume_from=10, recorded=[5], on_disk=[5, 10, 15], last_step=16)
    (run.dir / KEPT / ".step-20.tmp-zz").mkdir()
    assert resume(run, engine) == [5, 10]
    assert left(run) == ["step-10", "step-10-downloads", "step-5", "step-5-downloads"]
    keep(run, 15)
    with Session(engine) as session:
        assert session.exec(select(Metric.step).where(Metric.step > 10)).all() == []
        session.add(Metric(job_id=JOB, step=15, loss=0.5))  # trained again
        run._record_kept(session, session.get(Job, JOB), [15])
        assert rows(session) == [5, 10, 15]
        assert session.get(JobCheckpoint, checkpoint_id(JOB, 15)).train_loss == 0.5


def test_pruning_removes_only_kept_checkpoints_never_the_final_adapter(run):
    keep(run, 5)
    final = run.dir / ADAPTER
    final.mkdir()
    (final / "adapter_model.safetensors").write_text("the job's")
    remove_folders([kept_adapter_dir(run.dir / KEPT, 5), final], run.dir / KEPT)
    assert left(run) == [] and final.is_dir()


class Engine:
    """A running engine, as far as ``_follow`` sees it."""

    def __init__(self) -> None:
        self.killed = False

    def poll(self) -> int | None:
        return -9 if self.killed else None

    def kill(self) -> None:
        self.killed = True

    def wait(self) -> int:
        return -9


def test_a_kept_adapter_that_cannot_be_recorded_kills_the_engine(run, engine):
    """Its zip cannot be made (a full disk, a folder gone, here a file in its downloads'
    place): the error ends the job, and the engine is killed first, not left training."""
    keep(run, 5)
    adapter_downloads_dir(kept_adapter_dir(run.dir / KEPT, 5)).write_text("not a folder")
    run.heartbeat = SimpleNamespace(lost=threading.Event())
    child = Engine()
    with Session(engine) as session, pytest.raises(OSError):
        run._follow(session, session.get(Job, JOB), child, SimpleNamespace(
            peak_bytes=lambda: None))
    assert child.killed
    assert job_dir(run.settings.storage_root, JOB) == run.dir


def test_a_resume_waiting_on_a_kept_adapters_lock_holds_no_write(run, engine, tmp_path,
                                                                   monkeypatch):
    """The lost attempt's worker hung while it zipped step 10's kept adapter, holding the
    zip's lock (as a test's SIGSTOP left it): the resume that records step 10 waits for it,
    and meanwhile every other writer of the one SQLite file (the reconciler, the API, this
    attempt's heartbeat) goes on, rather than waiting behind it until it fails."""
    prepare(run, engine, resume_from=10, recorded=[5], on_disk=[5, 10], last_step=12)
    lock = adapter_downloads_dir(kept_adapter_dir(run.dir / KEPT, 10)) / ".adapter-peft.zip.lock"
    monkeypatch.setattr(adapter_downloads, "MAKER_WAIT_S", HANG_GUARD_S)  # waits throughout
    with exclusive_lock(lock):
        resuming = threading.Thread(target=resume, args=(run, engine))
        assert_no_write_held_while_waiting(resuming, lock, tmp_path / "mebp.db")
    resuming.join()
    with Session(engine) as session:
        assert rows(session) == [5, 10]
        assert session.exec(select(Metric.step).where(Metric.step > 10)).all() == []


def test_a_resume_makes_a_kept_adapters_zip_whose_maker_hangs(run, engine, monkeypatch):
    """The lost attempt's worker hung (stopped, never to go on) while it zipped step 10's
    kept adapter, holding the zip's lock for good: the resume waits ``MAKER_WAIT_S`` for
    it, then makes the zip itself and records step 10, rather than waiting forever with the
    job read as running (CI stop 47)."""
    monkeypatch.setattr(adapter_downloads, "MAKER_WAIT_S", 0.5)
    prepare(run, engine, resume_from=10, recorded=[5], on_disk=[5, 10], last_step=12)
    downloads = adapter_downloads_dir(kept_adapter_dir(run.dir / KEPT, 10))
    with held_by_a_hung_process(downloads / ".adapter-peft.zip.lock") as holder:
        recorded, waited_s = finishes(lambda: resume(run, engine))
        assert holder.poll() is None  # it held the lock throughout
    assert recorded == [5, 10] and waited_s >= 0.5  # waited on that very lock, then made it
    made = downloads / "adapter-peft.zip"
    with Session(engine) as session:
        recorded = session.get(JobCheckpoint, checkpoint_id(JOB, 10))
    assert recorded.sha256 == kept_digest(made) == sha256_file(made)
