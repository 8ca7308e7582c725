"""Command-line options the service's commands share, defined once: ``mebp worker``'s are
parsed by ``python -m worker`` and offered by ``mebp worker``, which runs it."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_data_dir_argument(parser: argparse.ArgumentParser, why: str = "") -> None:
    parser.add_argument("--data-dir", type=Path,
                        help=f"{why}default ~/.local/share/mebp (MEBP_DATA_DIR)")


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_dir_argument(parser)
    parser.add_argument("--burst", action="store_true",
                        help="exit once the queue is empty")


def worker_argv(args: argparse.Namespace) -> list[str]:
    """``args`` parsed by ``add_worker_arguments``, as a command line again."""
    return [*(["--data-dir", str(args.data_dir)] if args.data_dir else []),
            *(["--burst"] if args.burst else [])]
