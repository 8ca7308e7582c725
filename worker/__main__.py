"""``python -m worker`` (what ``mebp worker`` runs): serve the queue until stopped."""

from __future__ import annotations

import argparse
import sys

from service.cli_args import add_worker_arguments
from service.settings import load_settings
from worker.main import work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mebp worker", description=(
        "run a worker for a shared Redis (REDIS_URL), database (DATABASE_URL) and storage "
        "(MEBP_STORAGE_DIR)"))
    add_worker_arguments(parser)
    args = parser.parse_args(argv)
    return work(load_settings(data_dir=args.data_dir), burst=args.burst)


if __name__ == "__main__":
    sys.exit(main())
