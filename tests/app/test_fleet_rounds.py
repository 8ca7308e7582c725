"""Rounds walk the data (issue 32, item 0), on the real service with a worker the test kills:
each phone keeps a cursor into its shard across rounds, so its round jobs together train
exactly the rows its local-only reference trains, in the same order, every row once before
any row twice (epochs wrap, reshuffled with the fleet's seed), even when a worker dies
mid-round and the job resumes; the rows are read from what each job's engine recorded it
trained. Device jobs score no validation file (the round's global adapter is scored), and
the reference runs wait behind the rounds' jobs, the fleet saying when they run."""

from __future__ import annotations

import json
from datetime import datetime

from held_engines import hold_engine, release, storage_of
from service_harness import Service
from test_faults import embedded_with_external_workers, kill_group  # noqa: F401 (a fixture)

from mebp_core.data.jsonl import read_examples
from mebp_core.data.tokenizer import ByteTokenizer

SEQ_LEN, DEVICES, ROUNDS, LOCAL_STEPS = 32, 2, 3, 36  # 36: not whole epochs of a shard
# every row exactly one sequence (30 bytes + BOS + EOS), so the engine's packed examples are
# the rows themselves, in file order
TEXTS = [f"row {i:02d} of the walk ".ljust(SEQ_LEN - 2, "abcdefghij"[i % 10]) for i in range(20)]
ROWS = b"".join(json.dumps({"text": text}).encode() + b"\n" for text in TEXTS)
VALIDATION = b"".join(json.dumps({"text": f"a held-out note {i}"}).encode() + b"\n"
                      for i in range(4))


def trained(service: Service, job_id: str) -> list[int]:
    """The examples of its data the job's engine recorded training on, step by step."""
    metrics = service.request("GET", f"/v1/jobs/{job_id}/metrics")[1]["data"]
    assert [m["step"] for m in metrics] == list(range(1, len(metrics) + 1))  # each step once
    return [index for m in metrics for index in m["data"]["examples"]]


def started(service: Service, job_id: str) -> datetime:
    return datetime.fromisoformat(service.request("GET", f"/v1/jobs/{job_id}")[1]["started_at"])


def test_rounds_walk_each_shard_as_its_local_only_reference_does(
        tmp_path, embedded_with_external_workers):  # noqa: F811
    examples = read_examples(_write(tmp_path, ROWS), ByteTokenizer(512), seq_len=SEQ_LEN,
                             vocab_size=512).examples
    assert {len(example.input_ids) for example in examples} == {SEQ_LEN}
    service, new_worker = embedded_with_external_workers()
    first = new_worker()
    training = service.upload("walk.jsonl", ROWS)[1]["id"]
    validation = service.upload("held-out.jsonl", VALIDATION)[1]["id"]
    status, fleet = service.request("POST", "/v1/fleets", {
        "model": "preset:tiny", "training_file": training, "validation_file": validation,
        "simulated": {"device": "iphone-15-pro-max", "count": DEVICES},
        "hyperparameters": {"steps": LOCAL_STEPS, "seq_len": SEQ_LEN, "learning_rate": 0.01,
                            "checkpoint_every": 1},
        "aggregation": "fedavg", "rounds": ROUNDS, "seed": 7, "references": True})
    assert status == 201, fleet
    assert fleet["references"]["schedule"] == "queued behind round 0 (0 of 3 done)"

    # a worker dies mid-job in round 1; the job resumes on another from its checkpoint
    fleet = service.fleet_when(fleet["id"], lambda f: len(f["rounds"]) == 2, "round 1 started")
    doomed = fleet["rounds"][1]["participants"][0]["job_id"]
    engine = hold_engine(storage_of(service), doomed, 3)
    kill_group(first)  # its engine dies with the horse
    release(engine)
    new_worker()
    fleet = service.fleet_after_rounds(fleet["id"], ROUNDS)
    fleet = service.fleet_when(fleet["id"], lambda f: f["references"]["schedule"] == "done",
                               "the references")
    assert service.request("GET", f"/v1/jobs/{doomed}")[1]["attempts"] == 2

    references = {run["member"]: run for run in fleet["references"]["runs"]}
    for member in range(DEVICES):
        seats = [seat for r in fleet["rounds"] for seat in r["participants"]
                 if seat["member"] == member]
        assert [seat["outcome"] for seat in seats] == ["trained"] * ROUNDS
        walked = [index for seat in seats for index in trained(service, seat["job_id"])]
        rows = seats[0]["examples"]
        assert len(walked) == ROUNDS * LOCAL_STEPS > 2 * rows
        for epoch in range(len(walked) // rows):  # every row once before any row twice
            assert sorted(walked[epoch * rows:(epoch + 1) * rows]) == list(range(rows)), walked
        assert walked == trained(service, references[member]["job_id"])
        for seat in seats:  # device jobs score no validation file
            job = service.request("GET", f"/v1/jobs/{seat['job_id']}")[1]
            assert job["validation_file"] is None
            metrics = service.request("GET", f"/v1/jobs/{seat['job_id']}/metrics")[1]["data"]
            assert all("val_loss" not in m["data"] for m in metrics)
            # nor keep checkpoints: a phone's update is its adapter
            assert service.request("GET", f"/v1/jobs/{seat['job_id']}/checkpoints")[1][
                "data"] == []
    assert all(r["eval_loss"] is not None for r in fleet["rounds"])  # the global adapters are

    # the references waited behind the rounds' jobs: none started before round 1's first
    assert min(started(service, run["job_id"]) for run in references.values()) > \
        started(service, fleet["rounds"][1]["participants"][0]["job_id"])


def _write(tmp_path, content: bytes):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(content)
    return path
