"""Turning a model spec (packed dir, Hugging Face dir, ``preset:NAME``) into a packed dir,
packing into a cache once and reusing it."""

from __future__ import annotations

import hashlib
import multiprocessing
from pathlib import Path

from mebp_core.cache import default_cache_dir
from mebp_core.store.format import FORMAT_VERSION, STORE_FILENAME
from mebp_core.store.pack import PRESET_PREFIX, pack_model
from mebp_core.store.presets import preset_config


def _source_fingerprint(src: Path) -> str:
    """Path plus size and mtime of config and weights, so an edited checkpoint repacks."""
    parts = [str(src.resolve())]
    for f in sorted(src.glob("*.safetensors*")) + [src / "config.json"]:
        if f.is_file():
            st = f.stat()
            parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def cache_key(spec: str | Path, quant: str, group_size: int) -> str:
    if isinstance(spec, str) and spec.startswith(PRESET_PREFIX):
        name = spec[len(PRESET_PREFIX) :]
        preset_config(name)  # unknown names fail here, before anything is created
        stem = f"preset-{name}"
    else:
        src = Path(spec)
        stem = f"hf-{src.resolve().name}-{_source_fingerprint(src)}"
    return f"{stem}-{quant}-g{group_size}-v{FORMAT_VERSION}"


def resolve_model(
    spec: str | Path,
    quant: str = "int4",
    group_size: int = 64,
    cache_dir: str | Path | None = None,
    isolated: bool = False,
) -> Path:
    """A packed model directory for ``spec``: a packed dir as is, anything else packed into
    the cache (``$MEBP_CACHE_DIR`` or ``~/.cache/mebp``) once.

    ``isolated`` packs in a child process, so the caller's memory (and the baseline its
    footprint is measured against) never holds what packing allocated.
    """
    if not (isinstance(spec, str) and spec.startswith(PRESET_PREFIX)):
        if (Path(spec) / STORE_FILENAME).is_file():
            return Path(spec)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = cache / cache_key(spec, quant, group_size)
    if not (out / STORE_FILENAME).is_file():
        if isolated:
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                pool.apply(pack_model, (spec, out), {"quant": quant, "group_size": group_size})
        else:
            pack_model(spec, out, quant=quant, group_size=group_size)
    return out
