"""Turning a model spec (packed dir, Hugging Face dir, ``preset:NAME``) into a packed dir,
packing into a cache once and reusing it."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import queue
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from mebp_core.cache import default_cache_dir
from mebp_core.proc import die_with_parent
from mebp_core.store.errors import StoreError
from mebp_core.store.format import FORMAT_VERSION, STORE_FILENAME
from mebp_core.store.preset_configs import PRESET_PREFIX, SHIPPED_PRESETS, preset_config
from mebp_core.store.shipped import shipped_sha256

if TYPE_CHECKING:
    from mebp_core.store.pack import Progress

CHILD_POLL_S = 0.5  # how often a silent packing child is checked for having died
CHILD_STOP_S = 5.0  # a terminated packing child's time to remove its partial output


class PackingStopped(StoreError):
    """Packing was stopped by its caller (``stop_requested``) before it finished; nothing of
    it is kept, and the next resolve packs again."""


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
    stop_requested: Callable[[], bool] | None = None,
) -> Path:
    """A packed model directory for ``spec``: a packed dir as is, anything else packed into
    the cache (``$MEBP_CACHE_DIR`` or ``~/.cache/mebp``) once, calling ``progress(done,
    total, tensor name)`` as each tensor is written.

    ``isolated`` packs in a child process, so the caller's memory (and the baseline its
    footprint is measured against) never holds what packing allocated; ``stop_requested``,
    polled as it packs, ends it early with ``PackingStopped`` (a worker told to stop).
    """
    out = packed_dir(spec, quant, group_size, cache_dir)
    if not (out / STORE_FILENAME).is_file():
        if isolated:
            _pack_in_child(spec, out, quant, group_size, progress,
                           stop_requested or (lambda: False))
        else:
            from mebp_core.store.pack import pack_model  # torch: only where a model is packed

            pack_model(spec, out, quant=quant, group_size=group_size, progress=progress)
    return out


def _pack_in_child(spec: str | Path, out: Path, quant: str, group_size: int,
                   progress: Progress | None, stop_requested: Callable[[], bool]) -> None:
    """``pack_model`` in a spawned process, its progress passed back as it goes; its error,
    if any, raised here. Stopped, the child is terminated (it removes its partial output)."""
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    child = context.Process(target=_pack_reporting, daemon=True,
                            args=(spec, out, quant, group_size, messages, os.getpid()))
    child.start()
    try:
        while True:
            if stop_requested():  # checked first: a stop signalled to both may end it too
                child.terminate()
                raise PackingStopped(f"packing {spec} was stopped before it finished")
            try:
                kind, payload = messages.get(timeout=CHILD_POLL_S)
            except queue.Empty:
                if not child.is_alive() and not stop_requested():
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
        child.join(timeout=CHILD_STOP_S)
        if child.is_alive():  # stopped, and stuck flushing progress nobody reads any more
            child.kill()
            child.join()


def _pack_reporting(spec, out: Path, quant: str, group_size: int, messages,
                    parent_pid: int) -> None:
    die_with_parent(signal.SIGTERM, parent_pid)  # a killed worker leaves no packing behind
    # terminated: unwinds, so pack_model removes its partial output on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        from mebp_core.store.pack import pack_model

        pack_model(spec, out, quant=quant, group_size=group_size,
                   progress=lambda *done: messages.put(("progress", done)))
    except SystemExit:  # terminated by its caller, who no longer listens
        raise
    except BaseException as exc:  # noqa: BLE001 (every failure goes back to the caller)
        messages.put(("error", exc))
        return
    messages.put(("done", None))
