"""The adapters a job's engine keeps at its checkpoint steps (``mebp_core.engine.kept_adapters``,
in the job's ``checkpoints/``), recorded as ``JobCheckpoint`` rows with that step's losses and
the sha256 of their PEFT zip, made here as a final adapter's is; the job's final adapter is
its last checkpoint (``record_final``). At most ``MEBP_MAX_CHECKPOINTS_PER_JOB`` are kept,
the oldest dropped (never the final); an attempt that resumes drops those of the steps it
trains again, which the engine then keeps anew under the same ids."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from sqlmodel import Session, col, select

from mebp_core.engine.kept_adapters import kept_adapter_dir, kept_steps
from mebp_core.lora.peft_files import ADAPTER_FILES
from service.adapter_downloads import adapter_file
from service.crud import add_event
from service.job_checkpoints import checkpoint_id
from service.models import Adapter, JobCheckpoint, Metric
from service.storage import adapter_downloads_dir
from service.webhooks import CHECKPOINT


def recorded_steps(session: Session, job_id: str) -> set[int]:
    return set(session.exec(select(JobCheckpoint.step)
                            .where(JobCheckpoint.job_id == job_id)).all())


def record_kept(session: Session, job_id: str, root: Path, steps: list[int]) -> None:
    """A row and an event for each of ``steps`` kept under ``root``; the caller commits. A
    kept step's metrics line was written before its folder, so its row is in by now.

    Every zip is made before the first row, and the caller holds no write open: making one
    waits on its lock, which a download or a lost attempt's hung worker may hold (at most
    ``adapter_downloads.MAKER_WAIT_S``: then it is made anyway), and a write held meanwhile
    would stop every writer of a SQLite database."""
    zips = {step: adapter_file(kept_adapter_dir(root, step), "peft", None, remake=True)
            for step in steps}
    for step, made in zips.items():
        folder = kept_adapter_dir(root, step)
        _add(session, job_id, step, path=folder, sha256=made.sha256,
             size=sum((folder / name).stat().st_size for name in ADAPTER_FILES))


def record_final(session: Session, job_id: str, adapter: Adapter, step: int,
                 keep: int) -> list[Path]:
    """The job's adapter, trained to ``step``, as its last checkpoint (the engine keeps no
    copy of a job's last step; one cancelled at a checkpoint step kept it already), then
    the oldest beyond ``keep`` dropped: their folders, for ``remove_folders`` once
    committed. No checkpoint event: the job's end (succeeded, cancelled) announces it."""
    if session.get(JobCheckpoint, checkpoint_id(job_id, step)) is None:
        _add(session, job_id, step, path=Path(adapter.path), sha256=adapter.sha256,
             size=adapter.bytes, announce=False)
    return drop_oldest(session, job_id, keep)


def _add(session: Session, job_id: str, step: int, *, path: Path, sha256: str,
         size: int, announce: bool = True) -> None:
    metric = session.exec(select(Metric).where(Metric.job_id == job_id,
                                               Metric.step == step)).first()
    train_loss = None if metric is None else metric.loss
    valid_loss = None if metric is None else metric.data.get("val_loss")
    row = session.merge(JobCheckpoint(
        id=checkpoint_id(job_id, step), job_id=job_id, step=step, train_loss=train_loss,
        valid_loss=valid_loss, path=str(path), sha256=sha256, bytes=size))
    if announce:
        add_event(session, job_id=job_id, kind=CHECKPOINT,
                  message=f"step {step}'s adapter kept as {row.id}",
                  data={"step": step, "loss": train_loss, "valid_loss": valid_loss,
                        "checkpoint_id": row.id, "sha256": sha256})


def drop_oldest(session: Session, job_id: str, keep: int) -> list[Path]:
    """Delete the rows of the job's checkpoints but the newest ``keep``; their folders, for
    ``remove_folders`` once that is committed."""
    return _drop(session, session.exec(
        select(JobCheckpoint).where(JobCheckpoint.job_id == job_id)
        .order_by(col(JobCheckpoint.step).desc()).offset(keep)).all())


def settle_resumed(session: Session, job_id: str, root: Path,
                   resumed_from: int) -> tuple[list[int], list[Path]]:
    """What an attempt resuming from step ``resumed_from`` does with the kept adapters an
    earlier one left under ``root``: those after it go, rows and folders (trained again,
    kept anew); of the folders up to it, those above the newest recorded step are to be
    recorded (kept, then the worker was lost), those older and unrecorded go (pruned, then
    the worker was lost before removing them), as do half-written or half-removed ones.
    Returns the steps to record and the folders to remove once committed."""
    for leftover in root.glob(".step-*"):  # .step-N.tmp-* staged, .step-N.trash-* pruned
        shutil.rmtree(leftover, ignore_errors=True)
    rows = session.exec(select(JobCheckpoint).where(JobCheckpoint.job_id == job_id,
                                                    JobCheckpoint.step > resumed_from)).all()
    dropped = _drop(session, rows)
    recorded = recorded_steps(session, job_id) - {row.step for row in rows}
    newest = max(recorded, default=0)
    on_disk = [step for step in kept_steps(root) if step not in recorded]
    return ([step for step in on_disk if newest < step <= resumed_from],
            dropped + [kept_adapter_dir(root, step) for step in on_disk
                       if step < newest or step > resumed_from])


def _drop(session: Session, rows: list[JobCheckpoint]) -> list[Path]:
    for row in rows:
        session.delete(row)
    return [Path(row.path) for row in rows]


def remove_folders(folders: list[Path], root: Path) -> None:
    """Remove dropped checkpoints' folders, only those under ``root`` (the job's
    ``checkpoints/``: never its final adapter). Each is renamed out of its place first, so
    a download asking for it meanwhile finds it gone, never half removed."""
    for folder in folders:
        if folder.parent.resolve() != root.resolve():
            continue
        trash = folder.with_name(f".{folder.name}.trash-{secrets.token_hex(4)}")
        try:
            os.rename(folder, trash)
        except FileNotFoundError:  # removed by an earlier attempt
            pass
        shutil.rmtree(adapter_downloads_dir(folder), ignore_errors=True)
        shutil.rmtree(trash, ignore_errors=True)
