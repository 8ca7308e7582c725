"""Which models a job may name: the presets, and Hugging Face directories an admin registered
from inside the configured model roots."""

from __future__ import annotations

from pathlib import Path

from sqlmodel import Session

from app.api.errors import invalid
from app.models import RegisteredModel
from app.settings import Settings
from mebp_core.plan.arch import Architecture, PlanInputError, load_architecture

PRESET = "preset:"


def model_source(session: Session, name: str, *, where: str = "body") -> str:
    """What the engine loads for ``name``: ``preset:NAME`` itself, or the registered path;
    a 422 naming the field when it is neither."""
    if name.startswith(PRESET):
        return name
    row = session.get(RegisteredModel, name)
    if row is None:
        raise invalid("model", "neither preset:NAME nor a registered model (GET /v1/models)",
                      name, where=where)
    return row.path


def model_architecture(session: Session, name: str, *, where: str = "body") -> Architecture:
    try:
        return load_architecture(model_source(session, name, where=where))
    except PlanInputError as exc:
        raise invalid("model", str(exc), name, where=where) from None


def confined_model_path(settings: Settings, path: str) -> Path:
    """``path`` resolved (symlinks too), or a 422 unless it lies inside a model root."""
    resolved = Path(path).resolve()
    roots = settings.model_root_paths
    if not any(resolved.is_relative_to(root) for root in roots):
        where = ", ".join(map(str, roots)) or "none are configured"
        raise invalid("path", f"outside the model roots ({where}; MEBP_MODEL_ROOTS)", path)
    if not (resolved / "config.json").is_file():
        raise invalid("path", "not a Hugging Face model directory (no config.json)", path)
    return resolved
