"""A worker's commands thread (RQ's pubsub listener) never holds up its stop: RQ's teardown
joins it, and one that had already read the unsubscribe reply waited for a message before it
looked again (RQ listens with a 60 s wait; redis-py 8.2 joins without a bound)."""

from __future__ import annotations

import os
import threading
import uuid

import pytest
from rq import Queue
from waiting import poll_until

from service.queue import connect
from worker.main import COMMANDS_POLL_S, ServiceWorker

REDIS_TEST_URL = os.environ.get("MEBP_TEST_REDIS", "redis://127.0.0.1:6379/0")


@pytest.fixture
def worker():
    connection = connect(REDIS_TEST_URL)
    queue = Queue(f"mebp-test-{uuid.uuid4().hex[:8]}", connection=connection)
    return ServiceWorker([queue], connection=connection)


def test_a_stop_joins_a_commands_thread_that_already_read_the_unsubscribe(worker):
    worker.subscribe()
    worker.pubsub.unsubscribe()
    # the thread reads the reply, then waits for the next message
    poll_until(lambda: worker.pubsub.subscribed, lambda subscribed: not subscribed, 30,
               lambda _: "the unsubscribe was never read", interval_s=0.01)
    stopped = threading.Event()
    threading.Thread(target=lambda: (worker.unsubscribe(), stopped.set()), daemon=True).start()
    assert stopped.wait(timeout=10 * COMMANDS_POLL_S), "the stop waited on the commands thread"
    assert not worker.pubsub_thread.is_alive()
