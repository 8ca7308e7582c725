"""Every path parameter is bounded (issue 29, finding 5): a fleet's round index of 10^20 was a
500 (an integer the database cannot hold). Walks every route of the API and the dashboard that
takes a path parameter, with each parameter in turn huge, negative or overlong and the others
real, on SQLite and PostgreSQL: never a 500, and an overlong one a 404 or 422 that no SQL
statement carries."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi.routing import iter_route_contexts
from service_harness import API_KEY, tiny_job
from sqlalchemy import event

from app.sessions import SESSION_COOKIE
from service.job_checkpoints import checkpoint_id

OVERLONG = "x" * 300
BAD = {"huge": str(10**20), "negative": "-1", "hugely negative": str(-10**20),
       "overlong": OVERLONG, "overlong digits": "9" * 300, "zero": "0"}
ROWS = b"".join(json.dumps({"text": f"row {i}"}).encode() + b"\n" for i in range(4))
# the routes with path parameters as this walk found them when it was written: a new one is
# walked too, and one gone from the app fails here until this list says so
KNOWN = {"/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel", "/v1/jobs/{job_id}/events",
         "/v1/jobs/{job_id}/metrics", "/v1/jobs/{job_id}/adapter", "/v1/datasets/{dataset_id}",
         "/v1/devices/{device_id}", "/v1/models/{name}/base", "/v1/models/{name}/base/formats",
         "/v1/fleets/{fleet_id}",
         "/v1/fleets/{fleet_id}/cancel", "/v1/fleets/{fleet_id}/rounds/{index}/adapter",
         "/jobs/{job_id}", "/jobs/{job_id}/cancel", "/fleets/{fleet_id}",
         "/v1/comparisons/{comparison_id}", "/v1/comparisons/{comparison_id}/cancel",
         "/comparisons/{comparison_id}", "/comparisons/{comparison_id}/cancel"}


@contextmanager
def statements(engine) -> Iterator[list[str]]:
    """Every SQL statement the engine runs in the block, with its parameters."""
    seen: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        seen.append(f"{statement} {parameters!r}")
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def signed_in(api) -> tuple[dict[str, str], str]:
    """The dashboard's cookie and a page's form token, as a browser holds them."""
    with api.anonymous() as client:
        response = client.post("/signin", data={"api_key": API_KEY},
                               headers={"Origin": api.url})
        cookie = {"Cookie": f"{SESSION_COOKIE}={response.cookies[SESSION_COOKIE]}"}
        page = client.get("/jobs", headers=cookie)
    token = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page.text).group(1)
    return cookie, token


def test_every_path_parameter_is_bounded(any_api):
    api = any_api
    dataset = api.upload("rows.jsonl", ROWS)[1]["id"]
    job = api.request("POST", "/v1/jobs", tiny_job(dataset, 1))[1]["id"]
    status, fleet = api.request("POST", "/v1/fleets", {
        "model": "preset:tiny", "training_file": dataset, "aggregation": "fedavg",
        "rounds": 2, "simulated": {"device": "pixel-8", "count": 1},
        "hyperparameters": {"steps": 1, "seq_len": 32}})
    assert status == 201, fleet
    real = {"job_id": job, "dataset_id": dataset, "device_id": "pixel-8", "name": "preset:tiny",
            "fleet_id": fleet["id"], "index": "0", "checkpoint_id": checkpoint_id(job, 1)}
    cookie, token = signed_in(api)
    walked, answers = set(), []
    try:
        with api.anonymous() as dashboard:
            for route in iter_route_contexts(api.client.app.routes):
                params = re.findall(r"{(\w+)}", route.path or "")
                if not params or not route.methods:  # (a mount serves files, not ids)
                    continue
                walked.add(route.path)
                api_route = route.path.startswith("/v1/")
                for method in sorted(route.methods - {"HEAD"}):
                    for param in params:
                        for label, value in BAD.items():
                            path = route.path.format(**{**real, param: value})
                            with statements(api.client.app.state.engine) as sql:
                                if api_route:
                                    response = api.client.request(method, path)
                                else:
                                    response = dashboard.request(
                                        method, path, headers={**cookie, "Origin": api.url},
                                        data={"csrf_token": token} if method == "POST" else None)
                            answers.append((method, route.path, param, label,
                                            response.status_code))
                            assert response.status_code < 500, (answers[-1], response.text)
                            if label.startswith("overlong"):
                                assert response.status_code in (404, 422), answers[-1]
                                assert not any(value in statement for statement in sql), sql
    finally:
        api.request("POST", f"/v1/fleets/{fleet['id']}/cancel")
        for job_id in (job, fleet["rounds"][0]["participants"][0]["job_id"]):
            api.request("POST", f"/v1/jobs/{job_id}/cancel")
    assert walked >= KNOWN, KNOWN - walked
    # the index past the rounds a fleet may have is refused before anything looks it up
    index = [a for a in answers if a[2] == "index" and a[3] in ("huge", "negative")]
    assert {a[4] for a in index} == {422}, index
