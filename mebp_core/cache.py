"""Where mebp caches packed presets, compiled kernels and the host calibration."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    return Path(os.environ.get("MEBP_CACHE_DIR") or Path.home() / ".cache" / "mebp")
