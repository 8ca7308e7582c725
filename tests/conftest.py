"""Suite-wide settings: nothing may reach a hub, and threads stay within the shared machine."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
