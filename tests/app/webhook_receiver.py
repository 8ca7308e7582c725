"""A webhook receiver on loopback for the tests: an HTTP server in a thread of its own that
records every POST and answers each path as told (a status code, or hanging), and the
Standard Webhooks signature check a receiver makes."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from openai import OpenAI

HANG = -1  # an answer: none, the connection held open until the test ends
Answer = Callable[[str, int], int]  # (webhook-id, its attempt from 1) -> status code or HANG


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def event(self) -> dict:
        return json.loads(self.body)


class Receiver:
    """An HTTP server on loopback in a thread of its own, recording every POST and answering
    each path as its ``answers`` say (200 for a path without)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.answers: dict[str, Answer] = {}
        self.release = threading.Event()  # ends every hanging answer
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["content-length"]))
                record = Received(self.path, {k.lower(): v for k, v in self.headers.items()},
                                  body)
                with receiver._lock:
                    receiver.received.append(record)
                    nth = sum(r.headers["webhook-id"] == record.headers["webhook-id"]
                              for r in receiver.received)
                answer = receiver.answers.get(self.path, lambda *_: 200)(
                    record.headers["webhook-id"], nth)
                if answer == HANG:
                    receiver.release.wait()
                    return
                self.send_response(answer)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, answer: Answer | None = None) -> str:
        """A path of its own, answered by ``answer``."""
        path = f"/hooks/{uuid.uuid4().hex[:8]}"
        if answer is not None:
            self.answers[path] = answer
        return f"http://127.0.0.1:{self.server.server_port}{path}"

    def at(self, url: str) -> list[Received]:
        path = "/" + url.split("/", 3)[3]
        with self._lock:
            return [r for r in self.received if r.path == path]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def verify(secret: str, received: Received) -> None:
    """Standard Webhooks' check, by hand: HMAC-SHA256 keyed by the secret's base64 key over
    ``{webhook-id}.{webhook-timestamp}.{body}``, one of the space-separated ``v1,`` values;
    then the OpenAI SDK's verifier, which implements the same."""
    headers = received.headers
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + received.body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    given = [part.split(",", 1) for part in headers["webhook-signature"].split()]
    assert any(version == "v1" and hmac.compare_digest(value, expected)
               for version, value in given), headers
    OpenAI(api_key="unused").webhooks.verify_signature(received.body, headers, secret=secret)
