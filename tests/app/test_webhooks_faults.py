"""Webhook receivers that misbehave, against a real `mebp serve` of their own: one that hangs
holds neither the deliveries to other receivers (nor more than its host's share of the
attempts in flight) nor the service's stop, which still ends every process within the 10 s
systemd and `docker stop` give; and without MEBP_WEBHOOK_ALLOW_PRIVATE a host name that
resolves to a private address is refused at send time, saying only that."""

from __future__ import annotations

import os
import signal
import socket
import time

from process_trees import STOP_BOUND_S, killed_after, process_tree, wait_until_exited
from service_harness import poll_until, start_service, stop_service, tiny_job
from webhook_harness import (
    FAST_WEBHOOKS,
    MAX_ATTEMPTS,
    all_ended,
    delivery_rows,
    insert_deliveries,
    submit,
    upload,
)
from webhook_receiver import HANG, Receiver

TIMEOUT_S = 60  # a hanging attempt is cut only this long after it starts


def test_a_hanging_receiver_holds_up_neither_other_receivers_nor_the_stop(tmp_path,
                                                                          model_cache):
    hanging, answering = Receiver(), Receiver()  # two hosts (ports)
    service = start_service(tmp_path, model_cache, {
        **FAST_WEBHOOKS, "MEBP_WEBHOOK_TIMEOUT_S": str(TIMEOUT_S),
        "MEBP_WEBHOOK_MAX_IN_FLIGHT_PER_HOST": "1"}, own_group=True)
    try:
        dataset = upload(service)
        stuck = submit(service, {**tiny_job(dataset, 1),
                                 "webhook_url": hanging.url(lambda *_: HANG)})
        assert service.finished(stuck["id"])["status"] == "succeeded"
        poll_until(lambda: hanging.received, lambda got: len(got) >= 1, 60,
                   lambda got: f"nothing posted to the hanging receiver: {got}")
        started = time.monotonic()
        job = submit(service, {**tiny_job(dataset, 1), "webhook_url": answering.url()})
        assert service.finished(job["id"])["status"] == "succeeded"
        # delivered while the hanging attempt still holds its slot (once, all attempts
        # waited for the slowest of their batch)
        rows = poll_until(
            lambda: service.request("GET", f"/v1/jobs/{job['id']}/webhook_deliveries")[1][
                "data"], all_ended(2), TIMEOUT_S / 2,
            lambda rows: f"held up behind the hanging receiver: {rows}")
        assert [r["status"] for r in rows] == ["delivered"] * 2, rows
        assert time.monotonic() - started < TIMEOUT_S
        # its host's one slot is taken: the job's second event waits, unposted
        assert len(hanging.received) == 1, [r.event["type"] for r in hanging.received]
        processes = process_tree(service.process.pid)
    except BaseException:
        service.process.kill()
        hanging.close()
        answering.close()
        raise
    finally:
        service.client.close()

    try:
        with killed_after(processes):
            os.kill(service.process.pid, signal.SIGTERM)
            wait_until_exited(processes, STOP_BOUND_S, "SIGTERM with an attempt hanging",
                              service.output)
    finally:
        hanging.close()
        answering.close()


def test_a_name_resolving_to_a_private_address_is_refused_when_sent(tmp_path, model_cache):
    """The host name resolves to loopback, where a receiver listens: without
    MEBP_WEBHOOK_ALLOW_PRIVATE nothing reaches it, and the error says only why."""
    name = socket.gethostname()
    assert socket.gethostbyname(name).startswith("127."), name  # this machine's /etc/hosts
    receiver = Receiver()
    service = start_service(tmp_path, model_cache, {
        **FAST_WEBHOOKS, "MEBP_WEBHOOK_ALLOW_PRIVATE": "false"})
    try:
        url = receiver.url().replace("127.0.0.1", name)
        ids = insert_deliveries(service, ("webhooks-private", url))
        row, = poll_until(lambda: delivery_rows(service, ids),
                          lambda rows: rows[0].status != "pending", 120,
                          lambda rows: f"still pending: {rows}")
        assert (row.status, row.attempts, row.last_status_code, row.last_error) \
            == ("failed", MAX_ATTEMPTS, None, "refused: private address"), row
        assert receiver.at(url) == []
    finally:
        stop_service(service)
        receiver.close()

