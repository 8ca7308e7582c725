"""``run_job``: what a worker does with a job id taken from the queue.

The worker packs the model (outside the cap), hands the job to the engine process started
ahead of it (``worker.warm_engine``) once its cap has the job's budget, copies each step's
metrics into the database as the engine writes them, passes a cancel on as SIGTERM, and
records how the engine ended (``worker.engine_outcome``), reading the kernel's peak and OOM
count before removing the cap. Told to stop itself, it gives the job back to the queue from
the engine's checkpoint (``worker.stopping``).
"""

from __future__ import annotations

import shutil
import signal
import sys
import time
from pathlib import Path

from pydantic import ValidationError
from redis.exceptions import RedisError
from rq import Queue, get_current_job
from sqlalchemy import Engine, func
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlmodel import Session, delete, select

from mebp_core.cache import default_cache_dir
from mebp_core.cpu import IdleWindow
from mebp_core.engine.kept_adapters import kept_steps
from mebp_core.engine.metrics_file import keep_steps_through
from mebp_core.lora.peft_files import AdapterError
from mebp_core.plan.correction import measured_step_time
from mebp_core.proc import die_with_parent
from mebp_core.store.preset_configs import PRESET_PREFIX
from mebp_core.store.resolve import PackingStopped, resolve_model
from mebp_core.units import MB
from service.crud import TERMINAL, add_event, fail_job, set_status
from service.db import database_url, make_engine
from service.disk_space import data_dir_short_of_room, keep_reserve, out_of_space
from service.models import Dataset, Job, Metric
from service.queue import enqueue_advance
from service.registry import (
    ModelPathError,
    UnknownModelError,
    confine_model_dir,
    model_source,
)
from service.settings import Settings
from service.storage import base_config_path, job_dir
from worker import warm_engine
from worker.child import CHECKPOINT, KEPT, METRICS
from worker.engine_files import (
    RESULT,
    EngineRequest,
    write_request,
)
from worker.engine_outcome import fail_limit_refused, record_cgroup_peak, record_outcome
from worker.host_plan import plan_on_this_worker
from worker.kept_checkpoints import (
    drop_oldest,
    record_kept,
    recorded_steps,
    remove_folders,
    settle_resumed,
)
from worker.lease import Heartbeat, claim_job, worker_name
from worker.measured_time import predicted_figures
from worker.memory_cap import LimitRefused, MemoryCap, remove_stale_caps
from worker.metrics_tail import MetricsTail
from worker.packing_progress import PackingProgress
from worker.stopping import EngineStop, StopSignal, checkpoint_step, ended_by_itself, give_back
from worker.storage_full import end_storage_full, ran_out_of_space
from worker.warm_engine import EngineProcess, EngineStartError, engine_for_job

POLL_S = 0.2


class LeaseLost(Exception):  # noqa: N818  (a signal to stop, not an error to report)
    """The job was re-queued under this worker (its heartbeat had gone stale): another
    attempt owns it now, so this one stops without writing anything."""


def run_job(job_id: str) -> str:
    """The RQ entry point (by name: ``worker.runner.run_job``); returns the final status."""
    # RQ runs jobs in a forked "horse" in a process group of its own: without this, a worker
    # killed outright would leave its horse (and the engine) training on, unwatched
    die_with_parent(signal.SIGKILL)
    stop = StopSignal().install()  # the worker passes its SIGTERM on: the job goes back
    settings = Settings()
    engine = make_engine(database_url(settings.database_url, settings.data_dir))
    run = JobRun(settings, engine, job_id, stop)
    try:
        return run.run()
    finally:
        wake_coordinator(engine, run.job_id)
        engine.dispose()


def wake_coordinator(engine: Engine, job_id: str) -> None:
    """A fleet's job that ended may end its round: ask for the fleet to be moved on. With
    the database or Redis down, the reconciler does it later."""
    try:
        with Session(engine) as session:
            job = session.get(Job, job_id)
            if job is None or job.fleet_id is None or job.status not in TERMINAL:
                return
        current = get_current_job()
        if current is not None:  # run by RQ: on the queue the job came from
            enqueue_advance(Queue(current.origin, connection=current.connection),
                            job.fleet_id)
    except (SQLAlchemyError, RedisError) as exc:
        print(f"mebp worker: fleet coordinator not woken ({exc}); the reconciler will",
              file=sys.stderr)


class JobRun:
    def __init__(self, settings: Settings, engine: Engine, job_id: str,
                 stop: StopSignal | None = None) -> None:
        self.settings, self.engine, self.job_id = settings, engine, job_id
        self.stop = stop or StopSignal()  # noted, not installed: a test's own run
        self.dir = job_dir(settings.storage_root, job_id)
        self.resumed_from = 0  # the checkpoint step this attempt continues from
        self.step_times: list[float] = []  # this attempt's, in step order
        self.decompress_times: list[float | None] = []  # the engine's clock on dequantizing
        self.kept: set[int] = set()  # the steps whose kept adapters have rows, committed

    def run(self) -> str:
        worker = worker_name()
        if self.stop.is_set():  # stopping before it took a job: it takes none
            return "skipped"
        with Session(self.engine) as session:
            # the delivered id only says a worker is free: the fairest queued job runs
            job = claim_job(session, worker,
                            max_running_per_tenant=self.settings.max_running_jobs_per_tenant)
            if job is None:
                current = session.get(Job, self.job_id)
                return "skipped" if current is None else current.status
            self.job_id, self.dir = job.id, job_dir(self.settings.storage_root, job.id)
            beat = max(1.0, self.settings.heartbeat_timeout_s / 5)
            with Heartbeat(self.engine, self.job_id, worker, beat) as self.heartbeat:
                keep_reserve(self.settings.data_dir, self.settings.storage_reserve_bytes,
                             self.settings.min_free_storage_bytes)
                short = data_dir_short_of_room(self.settings)
                if short is not None:  # no reserve held: if it filled the disk, its end
                    # could not be recorded and it would read running for good
                    self._fail_storage_full(session, worker, f"{short}; the job was not "
                                            "started")
                    return "failed"
                try:
                    request = self._prepare(session, job)
                    if self._run_capped(session, job, request) == "given back":
                        return "queued"
                except LeaseLost:
                    return "lost"
                except PackingStopped:  # told to stop while it packed the model
                    self._give_back(session, job)
                    return "queued"
                except (ModelPathError, UnknownModelError) as exc:  # unregistered or changed since
                    session.rollback()
                    self._fail_if_still_ours(session, worker, "invalid_input",
                                             f"model {job.model}: {exc}")
                    return "failed"
                except ValidationError as exc:  # a stored config this version cannot read
                    session.rollback()
                    self._fail_if_still_ours(session, worker, "invalid_input",
                                             f"the job's stored config: {exc}")
                    return "failed"
                except Exception as exc:  # the job ends failed; the worker keeps serving
                    session.rollback()
                    if out_of_space(exc):  # wherever it filled: a known end, not a bug
                        self._fail_storage_full(session, worker, ran_out_of_space(exc))
                        return "failed"
                    self._fail_if_still_ours(session, worker, "worker_error",
                                             f"{type(exc).__name__}: {exc}")
                    raise
            return job.status

    def _fail_if_still_ours(self, session: Session, worker: str, code: str,
                            message: str) -> None:
        job = session.get(Job, self.job_id)
        if job is not None and job.status == "running" and job.worker == worker:
            fail_job(session, job, code, message)
            session.commit()

    def _fail_storage_full(self, session: Session, worker: str, message: str) -> None:
        end_storage_full(session, self.dir, self.settings.data_dir, lambda: (
            self._fail_if_still_ours(session, worker, "storage_full", message)))

    def _prepare(self, session: Session, job: Job) -> EngineRequest:
        self.dir.mkdir(parents=True, exist_ok=True)
        config = job.train_config()  # the one read of the stored config in this attempt
        add_event(session, job_id=job.id, kind="log", message=f"preparing {job.model}")
        session.commit()
        source = model_source(session, job.model)  # preset:NAME, or a registered path
        if not source.startswith(PRESET_PREFIX):
            confine_model_dir(self.settings.model_root_paths, source)
        model_dir = resolve_model(source, quant=config.quant, group_size=config.group_size,
                                  cache_dir=self.settings.cache_dir or default_cache_dir(),
                                  isolated=True, progress=PackingProgress(session, job),
                                  stop_requested=self.stop.is_set)
        # the cores free as it starts, sampled while it is prepared (not while it packs)
        idle = IdleWindow(() if warm_engine.STARTING_PID is None
                          else (warm_engine.STARTING_PID,))
        shutil.copyfile(model_dir / "config.json",
                        base_config_path(self.settings.storage_root, job.id))
        if job.init_adapter is not None:  # .../fleets/<id>/round-<n>/adapter
            add_event(session, job_id=job.id, kind="log", message=f"starting from fleet "
                      f"{job.fleet_id}'s {Path(job.init_adapter).parent.name} global adapter")
        config = plan_on_this_worker(session, job, config, source, self.settings,
                                     worker_name(), idle)
        validation = None if job.validation_file is None else \
            session.get(Dataset, job.validation_file).path
        request = EngineRequest(config=config, model=source, model_dir=model_dir,
                                init_adapter=job.init_adapter,
                                data=session.get(Dataset, job.training_file).path,
                                validation_data=validation,
                                resume=self._resume_point(session, job),
                                keep_checkpoints=job.fleet_id is None)
        write_request(self.dir, request)
        return request

    def _resume_point(self, session: Session, job: Job) -> bool:
        """Where this attempt starts: the last checkpoint if an earlier attempt left one,
        else step 0. What an earlier attempt logged past that point is trained again, so
        its metrics go."""
        self.resumed_from = checkpoint_step(self.dir / CHECKPOINT)
        (self.dir / RESULT).unlink(missing_ok=True)
        keep_steps_through(self.dir / METRICS, self.resumed_from)
        session.exec(delete(Metric).where(Metric.job_id == job.id,
                                          Metric.step > self.resumed_from))
        # steps the lost worker logged but had not copied yet
        recorded = session.exec(select(func.max(Metric.step))
                                .where(Metric.job_id == job.id)).one() or 0
        for row in MetricsTail(self.dir / METRICS).read_new():
            if row["step"] > recorded:
                self._record_step(session, job, row)
        job.step = self.resumed_from
        if self.resumed_from:
            add_event(session, job_id=job.id, kind="log",
                      message=f"resuming from the checkpoint at step {self.resumed_from}")
        # the kept adapters of the steps trained again go; a lost worker's others are recorded
        new, dropped = settle_resumed(session, job.id, self.dir / KEPT, self.resumed_from)
        self.kept = recorded_steps(session, job.id)
        self._record_kept(session, job, new, dropped)
        return bool(self.resumed_from)

    def _record_kept(self, session: Session, job: Job, on_disk: list[int],
                     dropped: list[Path] | None = None) -> None:
        """Record the adapters kept at ``on_disk`` steps not recorded yet, drop the oldest
        beyond the limit, and commit (what else the session holds too); only then are the
        dropped folders removed."""
        new = [step for step in on_disk if step not in self.kept]
        dropped = dropped or []
        if new:
            session.commit()  # no write held open while record_kept waits on a zip's lock
            record_kept(session, job.id, self.dir / KEPT, new)
            dropped += drop_oldest(session, job.id, self.settings.max_checkpoints_per_job)
        session.commit()
        self.kept.update(new)
        remove_folders(dropped, self.dir / KEPT)

    def _run_capped(self, session: Session, job: Job, request: EngineRequest) -> str | None:
        """Run the engine capped and record its end; "given back" if the worker is stopping
        and the job went back to the queue instead."""
        remove_stale_caps(job.id)  # an earlier attempt's, if its worker died holding it
        cache_dir = self.settings.cache_dir or default_cache_dir()
        child = engine_for_job(self.settings.enforcement, cache_dir)
        cap = child.cap
        try:
            job.enforcement = cap.mode
            add_event(session, job_id=job.id, kind="log",
                      message=f"engine running under a {cap.mode} cap of "
                      f"{job.memory_budget_bytes / MB:.0f} MB"
                      + (f"; {child.warning}" if child.warning else ""),
                      data={"enforcement": cap.mode, "cap_mb": job.memory_budget_bytes / MB,
                            "engine_started_ahead": child.started_ahead,
                            "engine_forked": child.forked})
            session.commit()
            session.refresh(job)
            if job.cancel_requested:
                set_status(session, job, "cancelled", "cancelled before the engine started")
                session.commit()
                return None
            if self.stop.is_set():  # told to stop while it prepared the job
                return self._give_back(session, job)
            cap_name = f"{job.id}-a{job.attempts}"
            try:
                try:
                    child.assign(self.dir, cap_name, job.memory_budget_bytes)
                except (OSError, EngineStartError) as exc:  # the engine started ahead died
                    print(f"mebp worker: {job.id}: an engine started for it ({exc})",
                          file=sys.stderr, flush=True)
                    cap.close()
                    child = EngineProcess.start(self.settings.enforcement, cache_dir)
                    cap = child.cap
                    child.assign(self.dir, cap_name, job.memory_budget_bytes)
            except LimitRefused:  # what the engine holds is already over the budget
                fail_limit_refused(session, job, cap)
                return None
            self._follow(session, job, child, cap)
            if self.heartbeat.lost.is_set():
                raise LeaseLost
            if self.stop.is_set() and not ended_by_itself(self.dir, job.cancel_requested,
                                                          child.returncode, cap.oom_killed()):
                return self._give_back(session, job)
            record_outcome(session, job, self.dir, child.returncode, cap, request,
                           self.settings, self.decompress_times)
            return None
        finally:
            cap.close()

    def _give_back(self, session: Session, job: Job) -> str:
        session.rollback()
        give_back(session, job.id, job.worker, self.stop.name or "stopping",
                  checkpoint_step(self.dir / CHECKPOINT))
        return "given back"

    def _follow(self, session: Session, job: Job, child: EngineProcess,
                cap: MemoryCap) -> None:
        """Copy metrics into the database until the child exits; pass a cancel on."""
        tail = MetricsTail(self.dir / METRICS, start_at_end=True)  # earlier steps: in the db
        pending: list[dict] = []  # read but not yet committed: kept across database outages
        engine_stop = EngineStop(self.stop)
        while True:
            exited = child.poll() is not None
            if self.heartbeat.lost.is_set():  # re-queued under us: the next attempt owns it
                child.kill()
                child.wait()
                return
            kept = kept_steps(self.dir / KEPT)  # before the lines: a kept step's comes first
            pending += tail.read_new()  # after poll: a finished child's lines are all in
            try:
                for row in pending:
                    self._record_step(session, job, row)
                record_cgroup_peak(job, cap)
                session.add(job)
                session.commit()
                pending.clear()
                self._record_kept(session, job, kept)  # and commits
                session.refresh(job)
            except OperationalError as exc:  # the database is briefly away; the engine goes on
                session.rollback()
                if out_of_space(exc):  # its disk is full: not brief, the job ends
                    child.kill()
                    child.wait()
                    raise
                time.sleep(POLL_S)
                continue
            except (OSError, AdapterError):  # a kept adapter not recorded (a full disk, ...):
                session.rollback()  # the job ends with the engine, which no cap may stop
                child.kill()
                child.wait()
                raise
            if exited:
                return
            said = engine_stop.act(child, job.cancel_requested)
            if said is not None:
                add_event(session, job_id=job.id, kind="log", message=said)
            child.wait_exit(POLL_S)  # at once when it exits

    def _record_step(self, session: Session, job: Job, row: dict) -> None:
        step, loss = row["step"], row.get("loss")
        data = {key: value for key, value in row.items() if key not in ("step", "loss")}
        data.update(predicted_figures(job.planned()))
        session.add(Metric(job_id=job.id, step=step, loss=loss, data=data))
        job.step, job.last_loss = step, loss
        if step > self.resumed_from and row.get("step_time_s") is not None:
            self.step_times.append(row["step_time_s"])
            self.decompress_times.append(row.get("decompress_s"))
            job.step_time_s = measured_step_time(self.step_times)
        if "peak_anon_mb" in row:
            job.peak_anon_bytes = int(row["peak_anon_mb"] * MB)
        if "peak_mb" in row:  # the charged figure (anonymous + shared), the run's peak so far
            job.peak_memory_bytes = int(row["peak_mb"] * MB)
        if row.get("cgroup_usage_peak_mb") is not None:
            job.cgroup_peak_bytes = max(job.cgroup_peak_bytes or 0,
                                        int(row["cgroup_usage_peak_mb"] * MB))
