"""Which models a job may name: the presets, and Hugging Face directories an admin registered
from inside the configured model roots. Errors are the domain's; routes turn them into 4xx
(``app.api.model_lookup``)."""

from __future__ import annotations

from pathlib import Path

from sqlmodel import Session

from mebp_core.plan.arch import Architecture, load_architecture
from mebp_core.store.preset_configs import PRESET_PREFIX
from service.models import RegisteredModel


class UnknownModelError(LookupError):
    """A job named a model that is neither ``preset:NAME`` nor registered."""


class ModelPathError(ValueError):
    """A registered model's directory, or a file in it, lies outside the model roots or
    cannot be read as one."""


def model_source(session: Session, name: str) -> str:
    """What the engine loads for ``name``: ``preset:NAME`` itself, or the registered path."""
    if name.startswith(PRESET_PREFIX):
        return name
    row = session.get(RegisteredModel, name)
    if row is None:
        raise UnknownModelError("neither preset:NAME nor a registered model (GET /v1/models)")
    return row.path


def model_architecture(session: Session, name: str) -> Architecture:
    """The planner's view of ``name``; ``PlanInputError`` when its config cannot be read."""
    return load_architecture(model_source(session, name))


def confine_model_dir(roots: list[Path], path: str) -> Path:
    """``path`` with its symlinks resolved, checked for every file the engine may read, in
    subdirectories too: a ``config.json`` symlinked out of the roots would otherwise be read
    from anywhere. The worker checks again before it reads, as the directory may have
    changed since it was registered."""
    where = ", ".join(map(str, roots)) or "none are configured"
    resolved = _resolve(Path(path))
    if not _inside(resolved, roots):
        raise ModelPathError(f"outside the model roots ({where}; MEBP_MODEL_ROOTS)")
    try:
        entries = list(resolved.iterdir()) if resolved.is_dir() else []
    except OSError as exc:
        raise ModelPathError(f"cannot list the directory: {exc.strerror}") from None
    if not any(entry.name == "config.json" for entry in entries):
        raise ModelPathError("not a Hugging Face model directory (no config.json)")
    for entry in _walk(resolved, entries):
        target = _resolve(entry)
        if not _inside(target, roots):
            raise ModelPathError(f"{entry.relative_to(resolved)} resolves outside the model "
                                 f"roots ({where})")
    if not (resolved / "config.json").is_file():
        raise ModelPathError("config.json is not a regular file")
    return resolved


def _walk(directory: Path, entries: list[Path], depth: int = 4) -> list[Path]:
    """``entries`` and, a few levels down, what real subdirectories hold (a symlinked one
    is checked where it points, not followed)."""
    found = list(entries)
    for entry in entries:
        if depth and entry.is_dir() and not entry.is_symlink():
            try:
                found += _walk(directory, list(entry.iterdir()), depth - 1)
            except OSError as exc:
                raise ModelPathError(f"cannot list {entry.name}: {exc.strerror}") from None
    return found


def _resolve(path: Path) -> Path:
    try:
        return path.resolve(strict=True)
    except RuntimeError:  # Python 3.11 reports a symlink loop so
        raise ModelPathError(f"{path.name}: a symlink loop") from None
    except OSError as exc:
        raise ModelPathError(f"{path.name[:64]}: {exc.strerror}") from None


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path.is_relative_to(root) for root in roots)
