"""The federated fleets' coordinator, run by a worker as an RQ job
(``worker.coordinator.advance_fleet``): queued whenever a fleet's job ends, and by the API's
reconciler for a round left waiting (a coordinator killed mid-round runs again from the
database; ``service.federation.advance`` makes that safe)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from sqlmodel import Session

from mebp_core.cache import default_cache_dir
from mebp_core.config import TrainConfig
from mebp_core.proc import die_with_parent
from mebp_core.store.resolve import resolve_model
from service.db import database_url, make_engine
from service.federation import advance
from service.models import Dataset, Fleet
from service.queue import enqueue_from_this_job
from service.registry import model_source
from service.settings import Settings

EVAL_FIELDS = ("quant", "group_size", "compute_dtype", "seq_len", "batch_size")


def advance_fleet(fleet_id: str) -> list[str]:
    """The RQ entry point; returns the job ids of the round it started, if any."""
    die_with_parent(signal.SIGKILL)
    settings = Settings()
    engine = make_engine(database_url(settings.database_url, settings.data_dir))
    try:
        with Session(engine) as session:
            jobs = advance(session, fleet_id, settings.storage_root,
                           lambda fleet, adapter: evaluate(session, settings, fleet, adapter))
    finally:
        engine.dispose()
    enqueue_from_this_job(jobs)
    return jobs


def evaluate(session: Session, settings: Settings, fleet: Fleet, adapter: Path
             ) -> float | None:
    """The global adapter's loss on the fleet's validation set (none without one), by
    ``mebp eval`` in a child process: the coordinator keeps no model in memory."""
    request = fleet.spec["request"]
    if request["validation_file"] is None:
        return None
    config = TrainConfig.model_validate(next(m["job"]["config"] for m in fleet.spec["members"]
                                             if m["job"] is not None))
    model_dir = resolve_model(model_source(session, fleet.model), quant=config.quant,
                              group_size=config.group_size,
                              cache_dir=settings.cache_dir or default_cache_dir(), isolated=True)
    data = session.get(Dataset, request["validation_file"]).path
    options = [f"--{name.replace('_', '-')}={getattr(config, name)}" for name in EVAL_FIELDS]
    child = subprocess.run(
        [sys.executable, "-m", "mebp_core.cli", "eval", "--model", str(model_dir),
         "--data", data, "--adapter", str(adapter), "--json", *options],
        capture_output=True, text=True, check=False, env=dict(os.environ),
        preexec_fn=lambda: die_with_parent(signal.SIGKILL))  # a stopped worker leaves none
    if child.returncode != 0:
        raise RuntimeError(f"evaluating {adapter} failed: {child.stderr.strip()[-500:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])["loss"]
