"""Preparing a fleet whose training file is too large to split within its request, run by a
worker as an RQ job (``worker.fleet_split.prepare_fleet``, queued by ``POST /v1/fleets``):
the rows dealt and the shards written with no transaction open, then the shards' rows and
the fleet's jobs in one short one. A split that fails ends the fleet ``failed`` with the
reason, its shards removed and its queue seats given back; nothing of it is queued."""

from __future__ import annotations

import signal

from sqlmodel import Session, select

from mebp_core.atomic import exclusive_lock
from mebp_core.errors import out_of_space
from mebp_core.federated.split import SplitError
from mebp_core.proc import die_with_parent
from service.db import database_url, make_engine
from service.fleet_shards import FAILED, PREPARING, READY, deal_shards, make_fleet_jobs
from service.models import Dataset, Fleet
from service.queue import enqueue_from_this_job
from service.settings import Settings
from service.storage import coordinator_lock_path


def prepare_fleet(fleet_id: str) -> list[str]:
    """The RQ entry point; returns the ids of the jobs it queued."""
    die_with_parent(signal.SIGKILL)
    settings = Settings()
    engine = make_engine(database_url(settings.database_url, settings.data_dir))
    try:
        # one preparation at a time per fleet on this machine; across machines the row lock
        # and the status check below make a second one a no-op
        with exclusive_lock(coordinator_lock_path(settings.storage_root, fleet_id)), \
                Session(engine) as session:
            jobs = prepare(session, fleet_id, settings)
    finally:
        engine.dispose()
    enqueue_from_this_job(jobs)
    return jobs


def prepare(session: Session, fleet_id: str, settings: Settings) -> list[str]:
    """Deal and write the fleet's shards, then record them with its jobs; the job ids to
    enqueue (none if the fleet is not preparing, or its preparation failed)."""
    fleet = session.get(Fleet, fleet_id)
    if fleet is None or fleet.status != PREPARING:
        return []
    source = session.get(Dataset, fleet.spec.request.training_file)
    # detached, they keep what was read: the split reads them with no transaction open
    session.expunge_all()
    session.commit()
    try:
        shards = deal_shards(settings.storage_root, source, fleet)
    except SplitError as exc:
        return _fail(session, fleet_id, f"the data split failed: {source.filename}: {exc}")
    except OSError as exc:
        why = "the storage is full" if out_of_space(exc) else str(exc)
        return _fail(session, fleet_id, f"its shards could not be written: {why}")
    except Exception as exc:
        _fail(session, fleet_id, f"its preparation failed: {exc!r}")
        raise
    try:
        fleet = _locked(session, fleet_id)
        if fleet.status != PREPARING:  # cancelled meanwhile, or prepared by another
            session.rollback()
            if fleet.status != READY:  # (a ready one's shards are these very files)
                shards.remove()
            return []
        jobs = make_fleet_jobs(session, fleet, shards, settings.storage_root)
        session.commit()
    except Exception as exc:
        session.rollback()
        shards.remove()
        _fail(session, fleet_id, f"its jobs could not be recorded: {exc!r}")
        raise
    return jobs


def _locked(session: Session, fleet_id: str) -> Fleet:
    return session.exec(select(Fleet).where(Fleet.id == fleet_id).with_for_update()).one()


def _fail(session: Session, fleet_id: str, message: str) -> list[str]:
    """End a preparing fleet failed, its seats given back."""
    fleet = _locked(session, fleet_id)
    if fleet.status == PREPARING:
        fleet.status, fleet.error, fleet.reserved_jobs = FAILED, message[:2000], 0
        session.add(fleet)
    session.commit()
    return []
