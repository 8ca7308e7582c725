"""The package layers, written down as import-linter contracts (``pyproject.toml``) and held
here: mebp_core never imports the service; the service core imports neither the API nor the
worker, which do not import each other; the planner never imports torch; the engine and the
planner do not import each other; the worker never imports FastAPI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint_imports), "--no-cache"], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert "Contracts: 6 kept, 0 broken." in done.stdout, done.stdout[-4000:]
    assert done.returncode == 0, done.stderr[-2000:]
