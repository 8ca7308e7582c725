"""The model registry's answers for a request: its domain errors become 422s naming the
field (the registry itself knows nothing of HTTP, so the worker can use it too)."""

from __future__ import annotations

from pathlib import Path

from sqlmodel import Session

from app.api.errors import invalid
from mebp_core.plan.arch import Architecture, PlanInputError
from service.registry import (
    ModelPathError,
    UnknownModelError,
    confine_model_dir,
    model_architecture,
    model_source,
)
from service.settings import Settings


def model_source_or_422(session: Session, name: str, *, where: str = "body") -> str:
    try:
        return model_source(session, name)
    except UnknownModelError as exc:
        raise invalid("model", str(exc), name, where=where) from None


def model_architecture_or_422(session: Session, name: str, *,
                              where: str = "body") -> Architecture:
    try:
        return model_architecture(session, name)
    except (UnknownModelError, PlanInputError) as exc:
        raise invalid("model", str(exc), name, where=where) from None


def confined_model_path_or_422(settings: Settings, path: str) -> Path:
    """``path`` resolved, or a 422 on ``path`` unless it is a model directory inside a
    model root whose files all resolve inside the roots too."""
    try:
        return confine_model_dir(settings.model_root_paths, path)
    except ModelPathError as exc:
        raise invalid("path", str(exc), path) from None
