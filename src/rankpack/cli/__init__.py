"""The `rankpack` command line.

Each sub-command lives in its own module with two functions:
``register(subparsers)`` adds its parser and sets ``handler`` via ``set_defaults``;
the handler takes the parsed ``argparse.Namespace`` and returns an exit code.
Handlers raise `rankpack.errors.UserError` for bad input; `main` turns that into a
one-line message and exit code 2 (``--debug`` shows the traceback instead).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from rankpack.errors import UserError

# Sub-command modules, in the order `--help` lists them. A module not present in this
# checkout is skipped (tests check that every released command registers).
COMMAND_MODULES = (
    "rankpack.cli.demo_cmd",
    "rankpack.cli.plan_cmd",
    "rankpack.cli.decompose_cmd",
    "rankpack.cli.run_cmd",
    "rankpack.cli.runs_cmd",
    "rankpack.cli.profile_cmd",
    "rankpack.cli.queue_cmd",
    "rankpack.cli.multiplex_cmd",
    "rankpack.cli.model_cmd",
    "rankpack.cli.devcluster_cmd",
)


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; we print only the error, on one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(
        prog="rankpack",
        description=(
            "Rank-aware CPU allocation for MPI simulations: give each MPI rank its own "
            "cgroup ('rank pod') with a CPU request proportional to its load, "
            "profile and resize ranks while they run."
        ),
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument(
        "--db",
        metavar="PATH",
        default=None,
        help="SQLite results database (default: $RANKPACK_DB or the user data directory)",
    )
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=OneLineArgumentParser
    )
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list or os.environ.get("RANKPACK_DEBUG") == "1"
    parser = build_parser()
    try:
        try:
            args = parser.parse_args(args_list)
        except SystemExit as exc:  # --help (0) or a usage error (2), already printed
            return exc.code if isinstance(exc.code, int) else 2
        code: int = args.handler(args)
        return code
    except UserError as exc:
        if debug:
            raise
        print(f"rankpack: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            raise
        print("rankpack: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
