"""Turning a model spec (packed dir, Hugging Face dir, ``preset:NAME``) into a packed dir,
packing into a cache once and reusing it."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import queue
from pathlib import Path

from mebp_core.cache import default_cache_dir
from mebp_core.store.errors import StoreError
from mebp_core.store.format import FORMAT_VERSION, STORE_FILENAME
from mebp_core.store.pack import PRESET_PREFIX, Progress, pack_model
from mebp_core.store.preset_configs import SHIPPED_PRESETS
from mebp_core.store.presets import preset_config
from mebp_core.store.shipped import shipped_sha256

CHILD_POLL_S = 0.5  # how often a silent packing child is checked for having died


def _source_fingerprint(src: Path) -> str:
    """Path plus size and mtime of config and weights, so an edited checkpoint repacks."""
    parts = [str(src.resolve())]
    for f in sorted(src.glob("*.safetensors*")) + [src / "config.json"]:
        if f.is_file():
            st = f.stat()
            parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def source_config(spec: str | Path) -> dict:
    """The Hugging Face config of a model spec, read without packing anything."""
    if isinstance(spec, str) and spec.startswith(PRESET_PREFIX):
        return preset_config(spec[len(PRESET_PREFIX):])
    config_path = Path(spec) / "config.json"
    try:
        return json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StoreError(f"{config_path}: cannot read the model's config ({exc})") from exc


def cache_key(spec: str | Path, quant: str, group_size: int) -> str:
    if isinstance(spec, str) and spec.startswith(PRESET_PREFIX):
        name = spec[len(PRESET_PREFIX) :]
        preset_config(name)  # unknown names fail here, before anything is created
        stem = f"preset-{name}"
        if name in SHIPPED_PRESETS:  # new shipped weights must not reuse an old packing
            stem += f"-{shipped_sha256(name)[:16]}"
    else:
        src = Path(spec)
        stem = f"hf-{src.resolve().name}-{_source_fingerprint(src)}"
    return f"{stem}-{quant}-g{group_size}-v{FORMAT_VERSION}"


def packed_dir(spec: str | Path, quant: str = "int4", group_size: int = 64,
               cache_dir: str | Path | None = None) -> Path:
    """Where ``spec`` is (or will be, once packed) as a packed model: a packed dir itself,
    else its place in the cache."""
    if not (isinstance(spec, str) and spec.startswith(PRESET_PREFIX)):
        if (Path(spec) / STORE_FILENAME).is_file():
            return Path(spec)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return cache / cache_key(spec, quant, group_size)


def resolve_model(
    spec: str | Path,
    quant: str = "int4",
    group_size: int = 64,
    cache_dir: str | Path | None = None,
    isolated: bool = False,
    progress: Progress | None = None,
) -> Path:
    """A packed model directory for ``spec``: a packed dir as is, anything else packed into
    the cache (``$MEBP_CACHE_DIR`` or ``~/.cache/mebp``) once, calling ``progress(done,
    total, tensor name)`` as each tensor is written.

    ``isolated`` packs in a child process, so the caller's memory (and the baseline its
    footprint is measured against) never holds what packing allocated.
    """
    out = packed_dir(spec, quant, group_size, cache_dir)
    if not (out / STORE_FILENAME).is_file():
        if isolated:
            _pack_in_child(spec, out, quant, group_size, progress)
        else:
            pack_model(spec, out, quant=quant, group_size=group_size, progress=progress)
    return out


def _pack_in_child(spec: str | Path, out: Path, quant: str, group_size: int,
                   progress: Progress | None) -> None:
    """``pack_model`` in a spawned process, its progress passed back as it goes; its error,
    if any, raised here."""
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    child = context.Process(target=_pack_reporting, daemon=True,
                            args=(spec, out, quant, group_size, messages))
    child.start()
    try:
        while True:
            try:
                kind, payload = messages.get(timeout=CHILD_POLL_S)
            except queue.Empty:
                if not child.is_alive():
                    raise StoreError(f"packing {spec} died (exit code {child.exitcode})") \
                        from None
                continue
            if kind == "progress" and progress is not None:
                progress(*payload)
            elif kind == "error":
                raise payload
            elif kind == "done":
                return
    finally:
        child.join()


def _pack_reporting(spec, out: Path, quant: str, group_size: int, messages) -> None:
    try:
        pack_model(spec, out, quant=quant, group_size=group_size,
                   progress=lambda *done: messages.put(("progress", done)))
    except BaseException as exc:  # noqa: BLE001 (every failure goes back to the caller)
        messages.put(("error", exc))
        return
    messages.put(("done", None))
