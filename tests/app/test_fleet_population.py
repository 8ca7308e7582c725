"""Fleets at population scale: up to 10,000 simulated phones, of one profile or a mix of
profiles with shares, each its own shard; rounds draw cohorts of at most 256. The fleet's
body lists its first members and sums the rest up; members and rounds are paged. A phone's
shard is written when it first trains, with the same rows every time it is dealt."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from dashboard_harness import open_page, shoot, sign_in
from playwright.sync_api import Page, expect
from service_harness import Service, in_process_service, start_service, stop_service
from sqlite_writers import assert_no_write_held_while_waiting
from sqlmodel import Session, select

from mebp_core.atomic import exclusive_lock
from mebp_core.config import TrainConfig
from mebp_core.federated.split import SplitSpec, read_rows, split_rows
from mebp_core.lora.peft_io import save_peft_adapter
from mebp_core.lora.spec import LoraSpec
from service import shard_files
from service.db import database_url, make_engine, upgrade_database
from service.federation import advance, rounds_of, start_round
from service.fleet_spec import (
    FleetMemberSpec,
    FleetRequest,
    FleetSpec,
    JobTemplate,
    Population,
    shard_id,
)
from service.models import Adapter, Dataset, Fleet, Job
from service.storage import new_id

POPULATION = 10_000
MIX = {"iphone-15": 0.4, "pixel-8": 0.3, "android-4gb": 0.3}
TINY = {"steps": 1, "seq_len": 32}


def rows(count: int) -> bytes:
    return b"".join(json.dumps({"text": f"r{i}"}).encode() + b"\n"
                    for i in range(count))


@pytest.fixture(scope="module")
def api(tmp_path_factory, model_cache, model_root) -> Iterator[Service]:
    """The fast tier (no worker) taking a training file of a row per phone."""
    with in_process_service(tmp_path_factory.mktemp("population"), model_cache, model_root,
                            max_upload_rows=POPULATION, max_upload_bytes=1 << 20) as api:
        yield api


@pytest.fixture(scope="module")
def population_file(api) -> str:
    status, body = api.upload("population.jsonl", rows(POPULATION))
    assert status == 201, body
    return body["id"]


def population(training_file: str, **change) -> dict:
    return {"model": "preset:tiny", "training_file": training_file, "aggregation": "fedavg",
            "simulated": {"mix": MIX, "count": POPULATION}, "participation": 0.01,
            "rounds": 2, "hyperparameters": TINY, **change}


def test_population_input_errors_name_the_field(api, population_file):
    cases = [
        ({"simulated": {"mix": MIX, "count": POPULATION + 1}}, ["simulated", "count"]),
        ({"simulated": {"mix": {"iphone-15": 0.5, "pixel-8": 0.4}, "count": 100}},
         ["simulated", "mix"]),
        ({"simulated": {"mix": {"iphone-15": 0.5, "nokia-3310": 0.5}, "count": 100}},
         ["simulated", "mix", "nokia-3310"]),
        ({"simulated": {"mix": MIX, "device": "pixel-8", "count": 100}}, ["simulated"]),
        ({"participation": 0.03}, ["participation"]),  # a cohort of 300
        ({"aggregation": "none", "participation": 1.0, "rounds": 1}, ["simulated", "count"]),
        ({"references": True, "validation_file": population_file}, ["references"]),
    ]
    for change, loc in cases:
        status, error = api.request("POST", "/v1/fleets", population(population_file, **change))
        assert status == 422 and error["detail"][0]["loc"] == ["body", *loc], (change, error)


def test_a_population_of_10000_is_made_with_its_first_cohort_and_paged(api, population_file):
    began = time.perf_counter()
    status, fleet = api.request("POST", "/v1/fleets", population(population_file))
    print(f"POST /v1/fleets, {POPULATION} phones: {time.perf_counter() - began:.2f} s")
    assert status == 201, fleet
    summary = fleet["summary"]
    assert summary["devices"] == POPULATION
    assert summary["by_device"] == {"iphone-15": 4000, "pixel-8": 3000, "android-4gb": 3000}
    assert len(fleet["members"]) == 256  # the body lists the first; the rest are paged
    (first,) = fleet["rounds"]
    assert first["summary"]["cohort"] == len(first["participants"]) == 100
    assert sum(first["summary"]["outcomes"].values()) == 100
    trainees = {seat["member"] for seat in first["participants"] if seat["job_id"]}
    assert trainees

    members, url = [], f"/v1/fleets/{fleet['id']}/members?limit=3000"
    while url:
        response = api.client.get(url)
        assert response.status_code == 200
        page = response.json()
        members += page["data"]
        url = page["next"] and httpx.URL(page["next"]).raw_path.decode()
        assert (url is None) == ("link" not in response.headers)
    assert [m["index"] for m in members] == list(range(POPULATION))
    assert [m["device"] for m in members[3999:4001]] == ["iphone-15", "pixel-8"]
    assert members[-1]["device"] == "android-4gb"
    # a phone's shard is written when it first trains: round 0's trainees only
    written = {m["index"]: m["training_file"] for m in members if m["training_file"]}
    assert set(written) == trainees
    assert all(api.request("GET", f"/v1/datasets/{shard}")[0] == 200
               for shard in written.values())
    assert api.request("GET", f"/v1/datasets/{shard_id(fleet['id'], 0)}")[0] == 404 \
        or 0 in trainees

    status, rounds = api.request("GET", f"/v1/fleets/{fleet['id']}/rounds?limit=1")
    assert status == 200 and rounds["count"] == 1 and rounds["next"] is None
    assert rounds["data"][0]["summary"] == first["summary"]
    status, none = api.request("GET", f"/v1/fleets/{fleet['id']}/rounds?after=0")
    assert status == 200 and none["data"] == []
    api.request("POST", f"/v1/fleets/{fleet['id']}/cancel")


def phone() -> FleetMemberSpec:
    """A profile's planned member, as a population stores one."""
    config = TrainConfig(steps=2, seq_len=32, batch_size=1)
    plan = {"planned": True, "configuration": "int4/g64", "feasible": True,
            "budget_mb": 1024.0, "margin": 0.1, "predicted_peak_mb": 100.0,
            "predicted_memory_mb": {"weights": 50.0}, "predicted_step_time_s": 0.5,
            "device_step_time_s_estimate": 1.0, "smallest_budget_mb": 120,
            "smallest_configuration": "int4/g64", "dominant_component": "weights"}
    return FleetMemberSpec(
        device="pixel-8", shard=None, training_file=None, fits=True, plan=plan,
        job=JobTemplate(model="preset:tiny", device_id=None, memory_budget_bytes=1 << 30,
                        plan=plan, config=config, training_file=None, validation_file=None))


def succeed_queued_jobs(session: Session, tmp_path: Path) -> None:
    for job in session.exec(select(Job).where(Job.status == "queued")):
        tensors = {"model.layers.0.self_attn.q_proj": (torch.ones(2, 8), torch.ones(8, 2))}
        path = save_peft_adapter(tmp_path / "jobs" / job.id, tensors,
                                 LoraSpec(rank=2, alpha=4.0, targets="all"), "base")
        session.add(Adapter(id=new_id("ad"), job_id=job.id, path=str(path), sha256="0",
                            bytes=1))
        job.status, job.step = "succeeded", job.total_steps
        session.add(job)
    session.commit()


PHONES, SEED = 20, 7  # this seed's round 1 draws phones of round 0 and new ones


def population_after_round_0(session: Session, tmp_path: Path) -> Fleet:
    """A population of ``PHONES`` on a training file of 60 rows (``tmp_path/source.jsonl``),
    whose round 0 has ended with every job succeeded."""
    (tmp_path / "datasets").mkdir()
    source = tmp_path / "source.jsonl"
    source.write_bytes(rows(60))
    request = FleetRequest(training_file="src", aggregation="fedavg", rounds=2,
                           participation=0.5, seed=SEED, hyperparameters={"steps": 2})
    session.add(Dataset(id="src", tenant="t", filename="source.jsonl", path=str(source),
                        bytes=source.stat().st_size, rows=60, sha256="0" * 64))
    fleet = Fleet(id=new_id("fleet"), tenant="t", model="preset:tiny", spec=FleetSpec(
        request=request, members=[], population=Population(profiles=[phone()], counts=[PHONES],
                                               examples=[3] * PHONES)))
    session.add(fleet)
    start_round(session, fleet, 0, tmp_path)
    session.commit()
    succeed_queued_jobs(session, tmp_path)
    return fleet


def test_a_phone_has_its_shard_written_when_first_drawn_with_the_same_rows(tmp_path):
    """Round 1 writes the shards of the phones it draws that round 0 did not, each holding
    the rows the seeded split deals it; a phone drawn again keeps its file and goes on in
    it where it stopped."""
    engine = make_engine(url := database_url(None, tmp_path))
    upgrade_database(url)
    source, phones, seed = tmp_path / "source.jsonl", PHONES, SEED
    with Session(engine) as session:
        fleet = population_after_round_0(session, tmp_path)
        before = {s.id: s.sha256 for s in session.exec(select(Dataset)
                                                       .where(Dataset.id != "src"))}
        assert advance(session, fleet.id, tmp_path, lambda f, a: None)
        first, second = rounds_of(session, fleet.id)
        drawn = [{seat.member for seat in r.participants} for r in (first, second)]
        assert drawn[0] & drawn[1] and drawn[1] - drawn[0]  # this seed draws both kinds
        shards = {s.id: s for s in session.exec(select(Dataset).where(Dataset.id != "src"))}
        assert set(shards) == {shard_id(fleet.id, i) for i in drawn[0] | drawn[1]}
        assert set(before) == {shard_id(fleet.id, i) for i in drawn[0]}
        dealt = split_rows(read_rows(source.read_bytes()), phones, SplitSpec(), seed)
        for index in drawn[0] | drawn[1]:
            written = Path(shards[shard_id(fleet.id, index)].path).read_bytes()
            assert written == b"".join(row.text + b"\n" for row in dealt[index])
        for index in drawn[0] & drawn[1]:
            assert shards[shard_id(fleet.id, index)].sha256 == before[shard_id(fleet.id, index)]
            job = session.get(Job, next(s.job_id for s in second.participants
                                        if s.member == index))
            assert job.training_file == shard_id(fleet.id, index)
            assert job.train_config().data_start_batch == 2


@pytest.mark.parametrize("held_up", ["shard files", "evaluation"])
def test_a_coordinator_held_up_in_its_file_io_holds_no_write(tmp_path, monkeypatch, held_up):
    """Ending round 0 and starting round 1 writes files (the global adapter, the shards of
    the phones drawn for the first time) and scores the adapter: while either is held up
    (here by a lock, as a slow disk or model would), every other writer of the one SQLite
    file (workers' heartbeats, the API, the reconciler) goes on, rather than waiting
    behind the coordinator until it fails."""
    engine = make_engine(url := database_url(None, tmp_path))
    upgrade_database(url)
    with Session(engine) as session:
        fleet_id = population_after_round_0(session, tmp_path).id
    lock = tmp_path / "held-up.lock"
    write_member_shards = shard_files.write_member_shards

    def write_when_let(*args):
        with exclusive_lock(lock):
            return write_member_shards(*args)

    def evaluate(fleet, adapter):
        if held_up == "evaluation":
            with exclusive_lock(lock):
                pass
        return 1.0

    if held_up == "shard files":
        monkeypatch.setattr(shard_files, "write_member_shards", write_when_let)
    started: list[str] = []

    def coordinate() -> None:
        with Session(engine) as session:
            started.extend(advance(session, fleet_id, tmp_path, evaluate))

    with exclusive_lock(lock):
        coordinator = threading.Thread(target=coordinate, name="coordinator")
        assert_no_write_held_while_waiting(coordinator, lock, tmp_path / "mebp.db")
    coordinator.join()
    with Session(engine) as session:
        first, second = rounds_of(session, fleet_id)
        assert (first.status, first.eval_loss, second.status) == ("done", 1.0, "running")
        assert started == [seat.job_id for seat in second.participants if seat.job_id]
        shards = session.exec(select(Dataset).where(Dataset.id != "src")).all()
        assert {s.id for s in shards} == {shard_id(fleet_id, seat.member) for r in
                                          (first, second) for seat in r.participants}
        assert all(Path(s.path).stat().st_size == s.bytes for s in shards)
    engine.dispose()


@pytest.fixture(scope="module")
def served(tmp_path_factory, model_cache, model_root) -> Iterator[Service]:
    """``mebp serve`` with a worker, taking a training file of a row per phone."""
    service = start_service(tmp_path_factory.mktemp("population-served"), model_cache, {
        "MEBP_MODEL_ROOTS": str(model_root), "MEBP_MAX_UPLOAD_ROWS": str(POPULATION),
        "MEBP_MAX_UPLOAD_BYTES": str(1 << 20)})
    yield service
    stop_service(service)


@pytest.fixture
def page(chromium, served) -> Iterator[Page]:
    with open_page(chromium, served.url) as page:
        yield page


def test_the_page_of_a_population_shows_its_rounds_summed_up(page, served):
    """10,000 phones: the first 32 listed with a note, a row per round (cohort, outcomes,
    loss, memory and on-device time spread), no grid nor curve per phone."""
    status, source = served.upload("population.jsonl", rows(POPULATION))
    assert status == 201, source
    status, fleet = served.request("POST", "/v1/fleets", population(
        source["id"], rounds=1, participation=0.0003))  # a cohort of 3
    assert status == 201, fleet
    sign_in(page, served.api_key)
    page.goto(f"/fleets/{fleet['id']}")
    expect(page.locator("#members-note")).to_contain_text(f"first 32 of {POPULATION}")
    expect(page.locator("#fleet-summary")).to_contain_text(
        "10000 devices (4000 iphone-15, 3000 pixel-8, 3000 android-4gb)")
    expect(page.locator("#device-table tbody tr")).to_have_count(32)
    summaries = page.locator("#round-summaries tbody tr")
    expect(summaries).to_have_count(1)
    expect(summaries.first.locator("td").nth(1)).to_have_text("3")
    expect(page.locator("#participation")).to_have_count(0)
    expect(page.locator("#loss-chart")).to_have_count(0)

    ended = served.fleet_after_rounds(fleet["id"], 1)
    summary = ended["rounds"][0]["summary"]
    assert sum(summary["outcomes"].values()) == 3
    page.reload()
    row = page.locator("#round-summaries tbody tr").first
    expect(row).to_have_attribute("data-status", ended["rounds"][0]["status"])
    for outcome, count in summary["outcomes"].items():
        expect(row.locator(".outcomes")).to_contain_text(f"{count} {outcome}")
    if summary["final_loss"] is not None:  # a phone trained: its loss, memory and time
        expect(row.locator("td").nth(3)).to_contain_text(f"{summary['final_loss']['mean']:.4f}")
        expect(row.locator("td").nth(5)).not_to_have_text("-")
    expect(row.locator("td").nth(6)).not_to_have_text("-")
    shoot(page, "fleet-population")
