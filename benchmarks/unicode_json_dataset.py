"""A fine-tuning dataset the pycode preset has never seen: JSON records of Unicode characters.

    .venv/bin/python -m benchmarks.unicode_json_dataset examples/unicode-json

One JSONL {"text": ...} row per named character of a few scripts (Latin-1 Supplement and
Latin Extended-A/B, Greek and Coptic, Cyrillic), its properties read from Python's own
`unicodedata` (Unicode 14.0.0 in Python 3.11), so the files are the same wherever Python
3.11 runs. Every 20th character goes to the validation file. The stdlib source the preset
was pretrained on names none of these characters (unicodedata is a C module).
"""

from __future__ import annotations

import argparse
import json
import unicodedata
from pathlib import Path

CODEPOINT_RANGES = ((0x00A0, 0x0250), (0x0370, 0x0400), (0x0400, 0x0500))
VALIDATION_EVERY = 20


def describe_character(char: str) -> dict:
    return {
        "codepoint": f"U+{ord(char):04X}",
        "char": char,
        "name": unicodedata.name(char),
        "category": unicodedata.category(char),
        "bidirectional": unicodedata.bidirectional(char),
        "mirrored": bool(unicodedata.mirrored(char)),
        "east_asian_width": unicodedata.east_asian_width(char),
        "decomposition": unicodedata.decomposition(char),
        "lower": char.lower(),
        "upper": char.upper(),
    }


def named_characters() -> list[str]:
    chars = [chr(cp) for start, stop in CODEPOINT_RANGES for cp in range(start, stop)]
    return [c for c in chars if unicodedata.name(c, "")]


def write_rows(path: Path, chars: list[str]) -> None:
    lines = [
        json.dumps({"text": json.dumps(describe_character(c), ensure_ascii=False)},
                   ensure_ascii=False)
        for c in chars
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", type=Path)
    out_dir = p.parse_args().out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    chars = named_characters()
    validation = chars[VALIDATION_EVERY - 1 :: VALIDATION_EVERY]
    training = [c for i, c in enumerate(chars) if (i + 1) % VALIDATION_EVERY]
    write_rows(out_dir / "train.jsonl", training)
    write_rows(out_dir / "validation.jsonl", validation)
    print(f"unicodedata {unicodedata.unidata_version}: {len(training)} training rows, "
          f"{len(validation)} validation rows in {out_dir}")


if __name__ == "__main__":
    main()
