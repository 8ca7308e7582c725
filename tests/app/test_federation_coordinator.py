"""The federated coordinator against a real database, with the crashes placed by the test: a
coordinator killed after writing a round's global adapter but before committing it runs
again to the same result, and a second coordinator after it finds nothing left to do; a
round nobody could train in ends failed without a hang, and the next one starts from the
last global adapter; a stalled round is found for the reconciler."""

from __future__ import annotations

import sys
import threading

import torch
from sqlalchemy.exc import OperationalError
from sqlmodel import Session, select
from waiting import poll_until

from mebp_core.config import TrainConfig
from mebp_core.lora.peft_io import load_peft_adapter, save_peft_adapter
from mebp_core.lora.spec import LoraSpec
from service import federation
from service.db import database_url, make_engine, upgrade_database
from service.federation import (
    _finish_round,
    advance,
    queue_references,
    rounds_of,
    stalled,
    start_round,
)
from service.fleet_spec import FleetMemberSpec, FleetRequest, FleetSpec, JobTemplate
from service.models import Adapter, Dataset, Fleet, FleetRound, Job
from service.storage import new_id, round_adapter_dir
from worker.lease import claim_job

SPEC = LoraSpec(rank=2, alpha=4.0, targets="all")
EXAMPLES = (10, 30, 60)


def plan(device_step_time_s: float) -> dict:
    """A plan summary as the planner records one, with the device's seconds per step."""
    return {"planned": True, "configuration": "int4/g64", "feasible": True, "budget_mb": 1024.0,
            "margin": 0.1, "predicted_peak_mb": 100.0, "predicted_memory_mb": {"weights": 50.0},
            "predicted_step_time_s": 0.5, "device_step_time_s_estimate": device_step_time_s,
            "smallest_budget_mb": 120, "smallest_configuration": "int4/g64",
            "dominant_component": "weights"}


def federated_fleet(session: Session, rounds: int = 3, deadline_s=None) -> Fleet:
    session.add(Dataset(id="d", tenant="t", filename="d.jsonl", path="/dev/null", bytes=0,
                        rows=100, sha256="0" * 64))
    config = TrainConfig(steps=2, seq_len=32)
    members = [FleetMemberSpec(
        device="pixel-8", shard=i, training_file="d", fits=True, examples=examples,
        plan=plan(1.0 + i),
        job=JobTemplate(model="preset:tiny", device_id=None, memory_budget_bytes=1 << 30,
                        plan=plan(1.0 + i), config=config, training_file="d",
                        validation_file=None))
        for i, examples in enumerate(EXAMPLES)]
    request = FleetRequest(training_file="d", aggregation="fedavg", rounds=rounds,
                           deadline_s=deadline_s, hyperparameters={"steps": 2})
    fleet = Fleet(id=new_id("fleet"), tenant="t", model="preset:tiny",
                  spec=FleetSpec(request=request, members=members))
    session.add(fleet)
    session.flush()
    return fleet


def finish_jobs(session: Session, tmp_path, index: int) -> dict[str, tuple]:
    """Every queued job succeeds with an adapter of its own; returns them by job id."""
    trained = {}
    for n, job in enumerate(session.exec(select(Job).where(Job.status == "queued"))):
        generator = torch.Generator().manual_seed(100 * index + n)
        tensors = {"model.layers.0.self_attn.q_proj": (torch.randn(2, 8, generator=generator),
                                                       torch.randn(8, 2, generator=generator))}
        path = save_peft_adapter(tmp_path / "jobs" / job.id, tensors, SPEC, "base")
        session.add(Adapter(id=new_id("ad"), job_id=job.id, path=str(path), sha256="0",
                            bytes=1))
        job.status, job.step = "succeeded", job.total_steps
        session.add(job)
        trained[job.id] = tensors
    session.commit()
    return trained


def expected_average(session: Session, current: FleetRound, trained: dict) -> torch.Tensor:
    seats = [(trained[s.job_id], s.examples) for s in current.participants]
    total = sum(examples for _, examples in seats)
    return sum(t["model.layers.0.self_attn.q_proj"][1].double() * e / total for t, e in seats)


def test_a_coordinator_killed_before_its_commit_runs_again_to_the_same_round(tmp_path):
    engine = make_engine(url := database_url(None, tmp_path))
    upgrade_database(url)
    evaluated = []
    evaluate = lambda fleet, adapter: evaluated.append(adapter) or 1.0  # noqa: E731
    with Session(engine) as session:
        fleet = federated_fleet(session)
        start_round(session, fleet, 0, tmp_path)
        session.commit()
        trained = finish_jobs(session, tmp_path, 0)
        first = rounds_of(session, fleet.id)[0]
        # the coordinator writes round 0's adapter, then dies before committing
        _finish_round(session, fleet, first, [s.model_copy(update={"outcome": "trained"})
                                              for s in first.participants], tmp_path, evaluate)
        session.rollback()
        assert rounds_of(session, fleet.id)[0].status == "running"
        assert round_adapter_dir(tmp_path, fleet.id, 0).is_dir()

    with Session(engine) as session, Session(engine) as other:
        jobs = advance(session, fleet.id, tmp_path, evaluate)
        assert len(jobs) == 3  # round 1 started, once
        assert advance(other, fleet.id, tmp_path, evaluate) == []  # nothing left to do
    with Session(engine) as session:
        done, second = rounds_of(session, fleet.id)
        assert (done.status, second.status) == ("done", "running")
        assert [s.outcome for s in done.participants] == ["trained"] * 3
        assert done.simulated_wall_s == 2 * 3.0  # the slowest device: 3 s/step, 2 steps
        _, combined = load_peft_adapter(round_adapter_dir(tmp_path, fleet.id, 0))
        torch.testing.assert_close(combined["model.layers.0.self_attn.q_proj"][1].double(),
                                   expected_average(session, done, trained))
        second_jobs = {s.job_id for s in second.participants}
        assert second_jobs == set(jobs)
        assert all(session.get(Job, j).init_adapter == str(round_adapter_dir(
            tmp_path, fleet.id, 0)) for j in second_jobs)
        # each device goes on in its shard where its round-0 job stopped (its 2 steps)
        assert [session.get(Job, j).train_config().data_start_batch for j in second_jobs] \
            == [2] * 3


def test_a_round_nobody_trains_in_ends_failed_and_the_next_starts_from_the_last_adapter(
        tmp_path):
    engine = make_engine(url := database_url(None, tmp_path))
    upgrade_database(url)
    with Session(engine) as session:
        fleet = federated_fleet(session, rounds=3)
        start_round(session, fleet, 0, tmp_path)
        session.commit()
        finish_jobs(session, tmp_path, 0)
        assert stalled(session, grace_s=-1) == [fleet.id]  # the reconciler's cue
        assert len(advance(session, fleet.id, tmp_path, lambda f, a: None)) == 3
        for job in session.exec(select(Job).where(Job.status == "queued")):
            job.status, job.error_code = "failed", "memory_budget_exceeded"
            session.add(job)
        session.commit()
        assert stalled(session, grace_s=3600) == []  # too recent: its coordinator is coming
        jobs = advance(session, fleet.id, tmp_path, lambda f, a: None)
        rounds = rounds_of(session, fleet.id)
        assert [r.status for r in rounds] == ["done", "failed", "running"]
        assert {s.outcome for s in rounds[1].participants} == {"out_of_memory"}
        assert all(session.get(Job, j).init_adapter == str(round_adapter_dir(
            tmp_path, fleet.id, 0)) for j in jobs)  # round 0's: round 1 combined nothing


def test_stragglers_past_the_deadline_get_no_job(tmp_path):
    engine = make_engine(url := database_url(None, tmp_path))
    upgrade_database(url)
    with Session(engine) as session:
        fleet = federated_fleet(session, deadline_s=5.0)  # 2 steps at 1, 2 and 3 s each
        jobs = start_round(session, fleet, 0, tmp_path)
        session.commit()
        seats = rounds_of(session, fleet.id)[0].participants
        assert [s.outcome for s in seats] == ["training", "training", "straggler"]
        assert len(jobs) == 2 and seats[2].job_id is None


def blocked_in(thread: threading.Thread, function: str) -> bool:
    """``thread`` is inside ``function`` now (a lock holder's suspended generator is not on
    its stack: only a waiter's is)."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def test_two_coordinators_at_once_finish_the_round_once(tmp_path, migrated_database_url):
    """Two coordinators woken by the round's last two jobs ending run ``advance`` at the
    same moment: the round is combined and evaluated once, the next starts once."""
    engine = make_engine(migrated_database_url)
    with Session(engine) as session:
        fleet = federated_fleet(session)
        start_round(session, fleet, 0, tmp_path)
        session.commit()
        fleet_id = fleet.id
        finish_jobs(session, tmp_path, 0)
    evaluated, started = [], {}
    barrier = threading.Barrier(2)
    threads = {}

    def evaluate(fleet, adapter):
        evaluated.append(adapter)
        # mid-round until the other coordinator waits on this one's lock, so they overlap
        other = threads["b" if threading.current_thread().name == "a" else "a"]
        poll_until(lambda: blocked_in(other, "exclusive_lock"), bool, 60,
                   lambda _: "the other coordinator never waited its turn", interval_s=0.01)
        return 1.0

    def coordinator(name: str) -> None:
        with Session(engine) as session:
            barrier.wait()
            started[name] = advance(session, fleet_id, tmp_path, evaluate)

    threads.update({name: threading.Thread(target=coordinator, args=(name,), name=name)
                    for name in "ab"})
    for thread in threads.values():
        thread.start()
    for thread in threads.values():
        thread.join(timeout=60)
    assert sorted(len(jobs) for jobs in started.values()) == [0, 3], started
    assert len(evaluated) == 1
    with Session(engine) as session:
        assert [r.status for r in rounds_of(session, fleet_id)] == ["done", "running"]
        queued = session.exec(select(Job).where(Job.status == "queued")).all()
        assert sorted(job.id for job in queued) == sorted(sum(started.values(), []))
    engine.dispose()


def test_a_worker_claims_every_queued_round_job_before_the_fleets_references(tmp_path):
    """The references wait behind the rounds' jobs, even when they were queued first."""
    engine = make_engine(url := database_url(None, tmp_path))
    upgrade_database(url)
    with Session(engine) as session:
        fleet = federated_fleet(session)
        references = queue_references(session, fleet)
        session.commit()
        round_jobs = start_round(session, fleet, 0, tmp_path)
        session.commit()
        claimed = [claim_job(session, f"w:{n}", max_running_per_tenant=100).id
                   for n in range(len(round_jobs) + len(references))]
    assert set(claimed[:len(round_jobs)]) == set(round_jobs)
    assert set(claimed[len(round_jobs):]) == set(references)


def test_every_pass_of_a_coordinator_holds_the_fleets_row_lock(tmp_path, postgres_url,
                                                                monkeypatch):
    """Rounds nobody trains in (every device a straggler) end at once and the coordinator
    starts the next in the same call, one commit each: every pass must hold the fleet's
    row lock, or a coordinator on another host could finish the same round beside it."""
    upgrade_database(postgres_url)
    engine = make_engine(postgres_url)
    with Session(engine) as session:
        fleet = federated_fleet(session, rounds=3, deadline_s=0.5)  # nobody makes 2 steps
        assert start_round(session, fleet, 0, tmp_path) == []
        session.commit()
        fleet_id = fleet.id
    held = []

    def start_round_checking_the_lock(session, fleet, index, storage_root):
        with engine.connect() as other:  # another host's coordinator, not waiting
            try:
                other.exec_driver_sql("SELECT id FROM fleets WHERE id = %s FOR UPDATE NOWAIT",
                                      (fleet_id,))
                held.append(False)
            except OperationalError:
                held.append(True)
            other.rollback()
        return start_round(session, fleet, index, storage_root)

    monkeypatch.setattr(federation, "start_round", start_round_checking_the_lock)
    with Session(engine) as session:
        assert advance(session, fleet_id, tmp_path, lambda f, a: None) == []
        assert [r.status for r in rounds_of(session, fleet_id)] == ["failed"] * 3
    assert held == [True, True]  # rounds 1 and 2, each started on its own pass
    engine.dispose()
