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
from dataclasses import dataclass
from pathlib import Path

from sqlmodel import Session

from mebp_core.cache import default_cache_dir
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
                           Scorer(session, settings).evaluate)
    finally:
        engine.dispose()
    enqueue_from_this_job(jobs)
    return jobs


@dataclass(frozen=True)
class Scoring:
    """What scoring a fleet's global adapters takes: its model resolved (a registered name
    to its path, packed at the fleet's quantization), its validation rows and the options."""

    model_dir: Path
    data: str
    options: list[str]


class Scorer:
    """The global adapters' loss on the fleet's validation set (none without one), by
    ``mebp eval`` in a child process: the coordinator keeps no model in memory. The model is
    resolved once per coordinator run, however many rounds it ends."""

    def __init__(self, session: Session, settings: Settings) -> None:
        self.session, self.settings = session, settings
        self._scoring: Scoring | None = None

    def evaluate(self, fleet: Fleet, adapter: Path) -> float | None:
        if fleet.spec.request.validation_file is None:
            return None
        if self._scoring is None:
            self._scoring = scoring(self.session, self.settings, fleet)
        return evaluate(self._scoring, adapter)


def scoring(session: Session, settings: Settings, fleet: Fleet) -> Scoring:
    config = fleet.spec.job_templates[0].config
    model_dir = resolve_model(model_source(session, fleet.model), quant=config.quant,
                              group_size=config.group_size,
                              cache_dir=settings.cache_dir or default_cache_dir(), isolated=True)
    data = session.get(Dataset, fleet.spec.request.validation_file).path
    return Scoring(model_dir, data, [f"--{name.replace('_', '-')}={getattr(config, name)}"
                                     for name in EVAL_FIELDS])


def evaluate(scoring: Scoring, adapter: Path) -> float:
    child = subprocess.run(
        [sys.executable, "-m", "mebp_core.cli", "eval", "--model", str(scoring.model_dir),
         "--data", scoring.data, "--adapter", str(adapter), "--json", *scoring.options],
        capture_output=True, text=True, check=False, env=dict(os.environ),
        preexec_fn=lambda: die_with_parent(signal.SIGKILL))  # a stopped worker leaves none
    if child.returncode != 0:
        raise RuntimeError(f"evaluating {adapter} failed: {child.stderr.strip()[-500:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])["loss"]
