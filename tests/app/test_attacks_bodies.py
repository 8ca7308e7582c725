"""Attacks with large bodies against a real ``mebp serve``: every body is capped before it is
read and before its key is checked, and an upload is checked as it arrives, so neither the
API's memory nor its disk grows with what a client sends."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from service_harness import API_KEY, start_service, stop_service

from mebp_core.units import MB

BOUNDARY = "attackboundary7d1f"
RSS_GROWTH_BYTES = 64 * MB  # a few batches and parsers; the attacks below send 100s of MB


@pytest.fixture(scope="module")
def roomy_service(tmp_path_factory, model_cache):
    """Uploads up to 256 MiB (the default), lines up to the harness's 4 KiB: a large
    upload is refused for its line, not its size."""
    service = start_service(tmp_path_factory.mktemp("roomy"), model_cache,
                            {"MEBP_MAX_UPLOAD_BYTES": str(256 * MB)})
    yield service
    stop_service(service)


def status_value(pid: int, field: str) -> int:
    """A memory figure of ``/proc/<pid>/status``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


@contextmanager
def rss_growth(service):
    """The API process's peak resident memory over the block, above where it started (the
    kernel's high-water mark, reset first)."""
    pid = service.process.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    growth = {"bytes": 0}
    before = status_value(pid, "VmRSS")
    yield growth
    growth["bytes"] = status_value(pid, "VmHWM") - before


def stored_files(service) -> set[Path]:
    datasets = service.output.parent / "data" / "storage" / "datasets"
    return set(datasets.iterdir()) if datasets.exists() else set()


def repeated(piece: bytes, total_bytes: int):
    """``piece`` again and again, ``total_bytes`` in all."""
    for start in range(0, total_bytes, len(piece)):
        yield piece[:total_bytes - start]


def multipart(content, filename: str = "big.jsonl"):
    """A multipart/form-data body around ``content`` (an iterable of bytes), streamed."""
    yield (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; "
           f"filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n").encode()
    yield from content
    yield f"\r\n--{BOUNDARY}--\r\n".encode()


MULTIPART = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


def answer_before_the_body_ends(service, path: str, headers: dict, first: bytes,
                                timeout_s: float = 30) -> tuple[int, bytes]:
    """Send a request's head and the first bytes of its body, never the rest; return the
    status and body the server answers with meanwhile (it may not wait for the rest)."""
    url = urlsplit(service.url)
    head = [f"POST {path} HTTP/1.1", f"Host: {url.netloc}",
            *(f"{name}: {value}" for name, value in headers.items())]
    if "Content-Length" not in headers:
        head.append("Transfer-Encoding: chunked")
        first = f"{len(first):x}\r\n".encode() + first + b"\r\n"
    with socket.create_connection((url.hostname, url.port), timeout=timeout_s) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + first)
        answer = b""
        while b"\r\n\r\n" not in answer:
            piece = sock.recv(65536)
            assert piece, "the server closed the connection without an answer"
            answer += piece
        status = int(answer.split(b" ", 2)[1])
        headers_end = answer.index(b"\r\n\r\n") + 4
        length = int(next(line.split(b":")[1] for line in answer[:headers_end].split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        while len(answer) < headers_end + length:
            answer += sock.recv(65536)
        return status, answer[headers_end:headers_end + length]


def test_an_unauthenticated_200_mb_json_body_is_refused_without_being_held(roomy_service):
    service = roomy_service
    body = b'{"model": "' + b"x" * MB
    with httpx.Client(base_url=service.url, timeout=120) as anonymous:
        for headers in ({}, {"Content-Length": str(200 * MB)}):  # chunked, then declared
            with rss_growth(service) as growth:
                response = anonymous.post("/v1/jobs", content=repeated(body, 200 * MB),
                                          headers={"Content-Type": "application/json",
                                                   **headers})
            assert growth["bytes"] < RSS_GROWTH_BYTES, (headers, growth)
            assert response.status_code in (401, 413), response.text
    assert service.process.poll() is None


def test_an_unauthenticated_upload_is_answered_before_its_body_is_read(service):
    first = next(multipart([])) + b'{"text": "' + b"x" * MB
    status, body = answer_before_the_body_ends(service, "/v1/datasets", MULTIPART, first)
    assert status == 401, body  # the key is checked before a byte of the body is read
    status, body = answer_before_the_body_ends(  # a declared 300 MB: refused from its head
        service, "/v1/datasets", {**MULTIPART, "Content-Length": str(300 * MB)}, first)
    assert status == 413, body  # Starlette's own answer: it does not name the limit
    assert not [path for path in stored_files(service) if path.name.startswith(".")]


def test_a_chunked_json_body_over_the_limit_is_a_413_naming_it(service):
    auth = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    status, body = answer_before_the_body_ends(service, "/v1/jobs", auth,
                                               b'{"model": "' + b"x" * (2 * MB))
    assert status == 413 and b"MEBP_MAX_REQUEST_BYTES" in body, body


def test_the_dashboard_form_reads_no_body_before_the_session_and_origin(service):
    """The job form takes an upload too: without a session, or from another origin, it is
    answered before a byte of the body is read."""
    first = next(multipart([])) + b'{"text": "' + b"x" * MB
    status, _ = answer_before_the_body_ends(service, "/jobs/new",
                                            {**MULTIPART, "Origin": service.url}, first)
    assert status == 303  # to the sign-in page
    status, _ = answer_before_the_body_ends(service, "/jobs/new",
                                            {**MULTIPART, "Origin": "http://evil.example"},
                                            first)
    assert status == 403


def test_an_authenticated_upload_over_the_limit_stops_at_the_limit(service):
    before = stored_files(service)
    first = next(multipart([])) + (b'{"text": "row"}\n' * (MB // 16))  # 1 MB of good rows
    auth = {"Authorization": f"Bearer {API_KEY}"}
    status, body = answer_before_the_body_ends(service, "/v1/datasets", {**auth, **MULTIPART},
                                               first)  # 400 MB follow, never sent
    assert status == 413 and b"MEBP_MAX_UPLOAD_BYTES" in body, body
    status, body = answer_before_the_body_ends(
        service, "/v1/datasets", {**auth, **MULTIPART, "Content-Length": str(400 * MB)}, first)
    assert status == 413, body
    assert stored_files(service) == before  # nothing staged is left behind


def test_concurrent_huge_one_line_uploads_are_refused_for_their_line_in_bounded_memory(
        roomy_service):
    service = roomy_service
    line = b'{"text": "' + b"y" * MB  # one line, never ended: 120 MB of it per upload

    def upload(index: int) -> httpx.Response:
        content = multipart(repeated(line, 120 * MB), f"line{index}.jsonl")
        return service.client.post("/v1/datasets", content=content, headers=MULTIPART)

    with rss_growth(service) as growth, ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(upload, range(4)))
    assert growth["bytes"] < RSS_GROWTH_BYTES, growth
    for index, response in enumerate(responses):
        assert response.status_code == 422, response.text
        error = response.json()["detail"][0]
        assert error["loc"] == ["body", "file"], error
        assert error["msg"].startswith(f"line{index}.jsonl:1: the line is longer than"), error
    assert not [path for path in stored_files(service) if path.name.startswith(".")]


def test_a_multipart_upload_still_round_trips_with_gzip_and_crlf(service):
    rows = b"".join(json.dumps({"text": f"row {i}"}).encode() + b"\r\n" for i in range(5))
    status, dataset = service.upload("crlf.jsonl", rows)
    assert status == 201 and dataset["rows"] == 5 and dataset["bytes"] == len(rows), dataset
