"""The pretraining corpus of the pycode preset: the Python 3.11 standard library's source.

Every `*.py` under /usr/lib/python3.11 (Debian's libpython3.11-stdlib), tests and third-party
dirs excluded, in sorted order. A file is held out when the sha256 of its relative path falls
in the first `HELD_OUT_PERCENT` percent, so the split depends on the name alone. Each file
becomes ids exactly as `mebp train` turns a JSONL {"text": ...} row into ids (BOS + UTF-8
bytes + EOS, rows laid end to end), so fine-tuning rows look like pretraining rows.

    .venv/bin/python -m benchmarks.pycode_corpus held_out.jsonl   # the held-out files as JSONL
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from mebp_core.data.rows import build_text
from mebp_core.data.tokenizer import ByteTokenizer

STDLIB_ROOT = Path("/usr/lib/python3.11")
CORPUS_GLOB = "**/*.py"
EXCLUDED_DIRS = ("test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages")
HELD_OUT_PERCENT = 5


@dataclass(frozen=True)
class CorpusFile:
    relative_path: str
    text: str


def is_held_out(relative_path: str) -> bool:
    digest = hashlib.sha256(relative_path.encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELD_OUT_PERCENT


def list_corpus_files(root: Path = STDLIB_ROOT) -> list[CorpusFile]:
    """The non-empty UTF-8 source files of the corpus, sorted by relative path."""
    files = []
    for path in sorted(root.glob(CORPUS_GLOB), key=lambda p: p.relative_to(root).as_posix()):
        relative = path.relative_to(root)
        if not path.is_file() or any(part in EXCLUDED_DIRS for part in relative.parts[:-1]):
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text:
            files.append(CorpusFile(relative.as_posix(), text))
    return files


def split_corpus(files: list[CorpusFile]) -> tuple[list[CorpusFile], list[CorpusFile]]:
    """(training files, held-out files)."""
    held_out = [f for f in files if is_held_out(f.relative_path)]
    training = [f for f in files if not is_held_out(f.relative_path)]
    return training, held_out


def encode_stream(files: list[CorpusFile], vocab_size: int) -> torch.Tensor:
    """The files as one id stream, each framed as the engine frames a "text" row."""
    tokenizer = ByteTokenizer(vocab_size)
    parts = [
        torch.tensor(build_text({"text": f.text}, tokenizer).input_ids, dtype=torch.int16)
        for f in files
    ]
    return torch.cat(parts)  # (N,)


def describe_files(files: list[CorpusFile]) -> dict:
    """File count, byte count and sha256 of the files' UTF-8 bytes concatenated in order."""
    digest = hashlib.sha256()
    nbytes = 0
    for f in files:
        data = f.text.encode("utf-8")
        digest.update(data)
        nbytes += len(data)
    return {"file_count": len(files), "byte_count": nbytes, "sha256": digest.hexdigest()}


def describe_corpus(training: list[CorpusFile], held_out: list[CorpusFile]) -> dict:
    return {
        "root": str(STDLIB_ROOT),
        "glob": CORPUS_GLOB,
        "excluded_dirs": list(EXCLUDED_DIRS),
        "held_out_rule": f"sha256(relative path)[:4] as big-endian int % 100 < {HELD_OUT_PERCENT}",
        "framing": "each file: BOS(256) + UTF-8 bytes + EOS(257), files laid end to end",
        "training": describe_files(training),
        "held_out": {**describe_files(held_out), "files": [f.relative_path for f in held_out]},
    }


def write_jsonl(files: list[CorpusFile], path: Path) -> None:
    """The files as JSONL {"text": ...} rows, the form `mebp eval` and `mebp train` read."""
    lines = [json.dumps({"text": f.text}, ensure_ascii=False) for f in files]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    p = argparse.ArgumentParser(description="Write the held-out files of the corpus as JSONL.")
    p.add_argument("out", type=Path)
    p.add_argument("--only", nargs="*", help="just these held-out files (relative paths)")
    args = p.parse_args()
    _, held_out = split_corpus(list_corpus_files())
    if args.only:
        unknown = set(args.only) - {f.relative_path for f in held_out}
        if unknown:
            raise SystemExit(f"not held-out files: {', '.join(sorted(unknown))}")
        held_out = [f for f in held_out if f.relative_path in args.only]
    write_jsonl(held_out, args.out)
    print(f"{len(held_out)} held-out files -> {args.out}")


if __name__ == "__main__":
    main()
