"""The package layers, written down as import-linter contracts (``pyproject.toml``) and held
here: mebp_core never imports the service; the service core imports neither the API nor the
worker, which do not import each other; the planner never imports torch; the engine and the
planner do not import each other; the worker never imports FastAPI."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint_imports), "--no-cache"], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    with open(REPO / "pyproject.toml", "rb") as file:
        contracts = tomllib.load(file)["tool"]["importlinter"]["contracts"]
    assert f"Contracts: {len(contracts)} kept, 0 broken." in done.stdout, done.stdout[-4000:]
    assert done.returncode == 0, done.stderr[-2000:]
