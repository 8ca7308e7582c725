"""The ``mebp`` entry point: the engine's commands plus the service's ``serve`` and ``db``."""

from __future__ import annotations

import argparse
import os
import re
import sys
from datetime import timedelta

from mebp_core.cli import Command
from mebp_core.cli import main as core_main
from service.cli_args import add_data_dir_argument, add_worker_arguments, worker_argv


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="default 127.0.0.1 (MEBP_HOST)")
    parser.add_argument("--port", type=int, help="default 8000 (MEBP_PORT)")
    add_data_dir_argument(parser)
    parser.add_argument("--workers", type=int, help="workers to start (default 1, "
                        "MEBP_WORKERS)")


def _db_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["upgrade"], help="apply pending migrations")
    add_data_dir_argument(parser, "where the SQLite database lives when DATABASE_URL is "
                          "unset; ")


def _keys_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["create", "revoke", "list"],
                        help="create: make a key for --tenant and print it once; revoke: "
                        "delete --key, or every key of --tenant; list: every key (or "
                        "--tenant's) by prefix, with its tenant, role, creation, expiry "
                        "and last use")
    parser.add_argument("--tenant", type=_tenant,
                        help="whose key: it sees only its tenant's datasets, jobs and fleets")
    parser.add_argument("--key", help="revoke: this key (e.g. a rotated MEBP_API_KEY)")
    parser.add_argument("--admin", action="store_true",
                        help="may also add device profiles and register models")
    parser.add_argument("--expires-in", type=_duration, metavar="DURATION",
                        help="create: the key stops working after this long (e.g. 90d, "
                        "12h, 30m, 45s); default: until revoked")
    add_data_dir_argument(parser, "where the SQLite database lives when DATABASE_URL is "
                          "unset; ")


def _tenant(text: str) -> str:
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,63}", text):
        raise argparse.ArgumentTypeError("a tenant is 1-64 of a-z, 0-9, _ and -, "
                                         f"starting with a letter or digit: {text!r}")
    return text


_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> timedelta:
    match = re.fullmatch(r"([0-9]{1,6})([smhd])", text.strip())
    if match is None or int(match[1]) == 0:
        raise argparse.ArgumentTypeError(f"a duration is a positive number and a unit "
                                         f"(s, m, h, d), e.g. 90d: {text!r}")
    return timedelta(seconds=int(match[1]) * _UNIT_S[match[2]])


def _run_keys(args: argparse.Namespace) -> int:
    from app.keys import keys_command  # not app.serve: no torch to start for a key

    if args.action == "create" and args.tenant is None:
        return _usage("mebp keys create needs --tenant")
    if args.action == "revoke" and (args.tenant is None) == (args.key is None):
        return _usage("mebp keys revoke needs exactly one of --key and --tenant")
    if args.expires_in is not None and args.action != "create":
        return _usage("--expires-in is for mebp keys create")
    return keys_command(args.action, tenant=args.tenant, key=args.key, admin=args.admin,
                        expires_in=args.expires_in, data_dir=args.data_dir)


def _usage(message: str) -> int:
    print(f"mebp: {message}", file=sys.stderr)
    return 2


def _run_serve(args: argparse.Namespace) -> int:
    from app.serve import serve

    return serve(host=args.host, port=args.port, data_dir=args.data_dir,
                 workers=args.workers)


def _run_worker(args: argparse.Namespace) -> int:
    """The worker package's own command, in this process's place (the API never imports
    the worker)."""
    os.execv(sys.executable, [sys.executable, "-m", "worker", *worker_argv(args)])


def _run_db(args: argparse.Namespace) -> int:
    from app.serve import upgrade

    return upgrade(data_dir=args.data_dir)


SERVICE_COMMANDS = {
    "serve": Command("run the service (the API key comes from MEBP_API_KEY, or one is made "
                     "and printed)", _serve_arguments, _run_serve),
    "worker": Command("run a worker for a shared Redis (REDIS_URL), database (DATABASE_URL) "
                      "and storage (MEBP_STORAGE_DIR)", add_worker_arguments, _run_worker),
    "keys": Command("API keys: `mebp keys create --tenant T [--admin]`, "
                    "`mebp keys revoke --key K | --tenant T`", _keys_arguments,
                    _run_keys),
    "db": Command("the service's database", _db_arguments, _run_db),
}


def main(argv: list[str] | None = None) -> int:
    return core_main(argv, extra=SERVICE_COMMANDS)


if __name__ == "__main__":
    sys.exit(main())
