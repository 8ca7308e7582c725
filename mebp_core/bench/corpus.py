"""A real text corpus every machine has offline: the docstrings of Python's standard library.

The stdlib source tree is walked in sorted order, each file parsed with ``ast``; module, class
and function docstrings are collected (``inspect.cleandoc``-normalized), short ones and
duplicates dropped. A docstring goes to validation when a hash of its text falls in the
validation fraction, so the split is deterministic and independent of the file order.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import sysconfig
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

# Directories that hold tests, vendored third-party code or generated tables, not prose.
SKIPPED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages",
                          "__pycache__", "lib2to3", "pydoc_data", "encodings"})
MIN_DOCSTRING_CHARS = 40
_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def iter_source_files(root: Path) -> Iterator[Path]:
    """``*.py`` under ``root`` in a deterministic order, skipping test and vendored dirs."""
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts[:-1]
        if any(part in SKIPPED_DIRS or part.startswith("test") for part in parts):
            continue
        yield path


def extract_docstrings(source: str) -> list[str]:
    """Module, class and function docstrings of one source file, in source order."""
    with warnings.catch_warnings():  # invalid escape sequences in old modules
        warnings.simplefilter("ignore")
        tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, _DOCUMENTED):
            text = ast.get_docstring(node, clean=True)
            if text and len(text) >= MIN_DOCSTRING_CHARS:
                found.append(text)
    return found


def collect_module_docstrings(root: Path | None = None, *,
                               max_files: int | None = None) -> list[tuple[str, str]]:
    """Unique docstrings of the stdlib (or of ``root``) with the module each came from
    (``json.decoder``), first occurrence order."""
    root = root or stdlib_dir()
    seen: set[str] = set()
    found = []
    for index, path in enumerate(iter_source_files(root)):
        if max_files is not None and index >= max_files:
            break
        try:
            docstrings = extract_docstrings(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a few stdlib files are deliberately invalid or not UTF-8
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        for text in docstrings:
            text = inspect.cleandoc(text)
            if text not in seen:
                seen.add(text)
                found.append((module.removesuffix(".__init__"), text))
    return found


def collect_docstrings(root: Path | None = None, *, max_files: int | None = None) -> list[str]:
    """Unique docstrings of the stdlib (or of ``root``), first occurrence order."""
    return [text for _, text in collect_module_docstrings(root, max_files=max_files)]


def is_validation(text: str, validation_fraction: float) -> bool:
    """Whether ``text`` belongs to the validation split: a stable hash, not Python's hash()."""
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64 < validation_fraction


def split_corpus(texts: Sequence[str],
                 validation_fraction: float = 0.05) -> tuple[list[str], list[str]]:
    """``(train, validation)`` by hash, each in the corpus order."""
    if not 0 < validation_fraction < 1:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    train, validation = [], []
    for text in texts:
        (validation if is_validation(text, validation_fraction) else train).append(text)
    return train, validation


def take_prefix(texts: Sequence[str], max_chars: int) -> list[str]:
    """The leading texts up to about ``max_chars`` characters (at least one)."""
    chosen, total = [], 0
    for text in texts:
        if chosen and total + len(text) > max_chars:
            break
        chosen.append(text)
        total += len(text)
    return chosen


def write_jsonl(texts: Sequence[str], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        for text in texts:
            out.write(json.dumps({"text": text}) + "\n")
    return path


def write_docstring_corpus(out_dir: Path, *, validation_fraction: float = 0.05,
                           validation_chars: int | None = None, root: Path | None = None,
                           max_files: int | None = None) -> dict:
    """Write ``train.jsonl`` and ``validation.jsonl``; ``validation_chars`` caps the latter
    to a fixed leading subset (validating on the whole split every few steps is slow)."""
    texts = collect_docstrings(root, max_files=max_files)
    train, validation = split_corpus(texts, validation_fraction)
    if validation_chars is not None:
        validation = take_prefix(validation, validation_chars)
    return {"train": str(write_jsonl(train, out_dir / "train.jsonl")),
            "validation": str(write_jsonl(validation, out_dir / "validation.jsonl")),
            "source": str(root or stdlib_dir()), "docstrings": len(texts),
            "train_docstrings": len(train), "validation_docstrings": len(validation),
            "train_chars": sum(map(len, train)),
            "validation_chars": sum(map(len, validation))}
