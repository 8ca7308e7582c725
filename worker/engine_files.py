"""What a worker and its engine child (``worker.child``) tell each other through the job
directory: ``request.json``, what to train, written by the worker; ``result.json``, how it
ended, written last by the child. Each side writes and reads them through these models; a
file of another shape is an ``EngineFileError`` naming it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from mebp_core.config import TrainConfig

REQUEST, RESULT = "request.json", "result.json"


class EngineFileError(ValueError):
    """A request or result file that does not read as one."""


class EngineRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    config: TrainConfig  # the configuration this attempt runs, its threads included
    model: str  # preset:NAME or the registered path, as the job named it
    model_dir: Path  # the packed store the engine reads
    data: Path
    validation_data: Path | None = None
    init_adapter: Path | None = None  # a federated round's global adapter
    resume: bool = False  # from the checkpoint an earlier attempt left
    # the adapter of every checkpoint step kept for download (a fleet's phone keeps none: its
    # update is its adapter, and thousands of phones would keep thousands each)
    keep_checkpoints: bool = False


class EngineFinished(BaseModel):
    """The engine ran to the end of its steps, or to a cancel (its adapter so far kept)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: Literal["succeeded", "cancelled"]
    steps: int
    final_loss: float | None
    peak_mb: float
    peak_anon_mb: float
    footprint_mb: float
    memory_method: str


class EngineFailed(BaseModel):
    """A failure the user can act on (``mebp_core.errors.MebpError``, or an allocation
    refused under the cap)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: Literal["failed"] = "failed"
    code: str
    message: str
    peak_rss_mb: float | None = None  # the kernel's high-water mark, after an allocation failed


EngineResult = Annotated[EngineFinished | EngineFailed, Field(discriminator="status")]
_RESULT = TypeAdapter(EngineResult)


def write_request(job_dir: Path, request: EngineRequest) -> None:
    (job_dir / REQUEST).write_text(request.model_dump_json(indent=2))


def read_request(job_dir: Path) -> EngineRequest:
    path = job_dir / REQUEST
    try:
        return EngineRequest.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise EngineFileError(f"{path}: not an engine request: {exc}") from None


def write_result(job_dir: Path, result: EngineFinished | EngineFailed) -> None:
    """Written whole or not at all: the worker takes a missing result for a killed engine."""
    staging = job_dir / f".{RESULT}.tmp"
    staging.write_bytes(_RESULT.dump_json(result))
    os.replace(staging, job_dir / RESULT)


def read_result(job_dir: Path) -> EngineFinished | EngineFailed | None:
    """The engine's result; None when it left none (killed, or it crashed)."""
    path = job_dir / RESULT
    if not path.is_file():
        return None
    try:
        return _RESULT.validate_json(path.read_bytes())
    except ValidationError as exc:
        raise EngineFileError(f"{path}: not an engine result: {exc}") from None
