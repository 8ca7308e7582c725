"""``python -m worker`` (what ``mebp worker`` runs): serve the queue until stopped."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from service.cli_args import add_worker_arguments
from service.settings import load_settings
from service.supervisor import EXPORTS_ONLY_FLAG
from worker.main import work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mebp worker", description=(
        "run a worker for a shared Redis (REDIS_URL), database (DATABASE_URL) and storage "
        "(MEBP_STORAGE_DIR)"))
    add_worker_arguments(parser)
    parser.add_argument(EXPORTS_ONLY_FLAG, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return work(load_settings(data_dir=args.data_dir), burst=args.burst,
                exports_only=args.exports_only)


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown: everything is written, and its garbage
    collection of torch's heap takes seconds on a busy host, inside the 10 s a stop has."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
