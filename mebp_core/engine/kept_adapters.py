"""The adapters a run keeps as it trains: at every ``checkpoint_every`` step, that step's PEFT
adapter in a folder of its own, ``step-<N>``, under the run's kept directory.

Each is written atomically (``peft_io.save_peft_adapter``), and a step trained again, by a
run resumed from an earlier checkpoint, replaces its folder whole. The resume checkpoint is
another thing: only the newest state, with the optimizer's, overwritten as the run goes.
"""

from __future__ import annotations

import re
from pathlib import Path

_STEP_DIR = re.compile(r"step-(\d+)")


def kept_adapter_dir(root: Path, step: int) -> Path:
    return root / f"step-{step}"


def kept_steps(root: Path) -> list[int]:
    """The steps whose adapters are kept under ``root``, in order: a folder being written
    (``.step-N.tmp-*``), or anything else beside them, is not one."""
    if not root.is_dir():
        return []
    matches = (_STEP_DIR.fullmatch(child.name) for child in root.iterdir() if child.is_dir())
    return sorted(int(match.group(1)) for match in matches if match)
