"""The `rankpack` command line.

Each sub-command lives in its own module with two functions:
``register(subparsers)`` adds its parser and sets ``handler`` via ``set_defaults``;
the handler takes the parsed ``argparse.Namespace`` and returns an exit code.
Handlers raise `rankpack.errors.UserError` for bad input; `main` turns that into a
one-line message and exit code 2 (``--debug`` shows the traceback instead).

Modules, one per command unless said: `demo_cmd`, `plan_cmd`, `decompose_cmd`, `run_cmd`,
`runs_cmd`, `profile_cmd` (with `profile_case`: ``profile CASE`` and ``--attach``),
`queue_cmd` (``submit``, ``queue``), `multiplex_cmd` (``multiplex``, ``events``),
`report_cmd`, `model_cmd`, `operator_cmd` (``operator``, ``simulations``), `top_cmd`,
`dashboard_cmd`, `nodeagent_cmd`, `devcluster_cmd`; shared by them: `common` (argument
validators, JSON output, the database path) and `backends` (``--backend`` and the
Kubernetes flags).
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import NoReturn

from rankpack.backend.protocol import BackendError
from rankpack.cli.common import parse_db
from rankpack.errors import UserError
from rankpack.quantities import InvalidQuantity

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
    "rankpack.cli.report_cmd",
    "rankpack.cli.model_cmd",
    "rankpack.cli.devcluster_cmd",
    "rankpack.cli.operator_cmd",
    "rankpack.cli.top_cmd",
    "rankpack.cli.dashboard_cmd",
    "rankpack.cli.nodeagent_cmd",
)


COMMANDS = {
    "demo": "rankpack.cli.demo_cmd",
    "plan": "rankpack.cli.plan_cmd",
    "decompose": "rankpack.cli.decompose_cmd",
    "run": "rankpack.cli.run_cmd",
    "runs": "rankpack.cli.runs_cmd",
    "profile": "rankpack.cli.profile_cmd",
    "submit": "rankpack.cli.queue_cmd",
    "queue": "rankpack.cli.queue_cmd",
    "multiplex": "rankpack.cli.multiplex_cmd",
    "events": "rankpack.cli.multiplex_cmd",
    "report": "rankpack.cli.report_cmd",
    "model": "rankpack.cli.model_cmd",
    "dev-cluster": "rankpack.cli.devcluster_cmd",
    "operator": "rankpack.cli.operator_cmd",
    "simulations": "rankpack.cli.operator_cmd",
    "top": "rankpack.cli.top_cmd",
    "dashboard": "rankpack.cli.dashboard_cmd",
    "node-agent": "rankpack.cli.nodeagent_cmd",
}
"""Which module registers each sub-command (a unit test keeps it equal to what they
register): a command line that names one imports only that module, so a daemon's start
(``node-agent``, ``operator``) costs only what it uses."""


def named_command(argv: Sequence[str]) -> str | None:
    """The sub-command `argv` names (after the global options), None if none."""
    skip = False
    for token in argv:
        if skip:
            skip = False
        elif token == "--db":
            skip = True
        elif not token.startswith("-"):
            return token
    return None


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; we print only the error, on one line."""

    def error(self, message: str) -> NoReturn:
        # Our validators write \x1f where the option's name belongs: "--ranks must be ...".
        message = re.sub(r"^argument (\S+?)(?:/\S+)?: \x1f", r"\1", message).replace(
            "\x1f", "value"
        )
        message = " ".join(message.split())  # one line, whatever the user typed
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; only the named command's module when `argv` names one."""
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
        type=parse_db,
        default=None,
        help="SQLite results database (default: $RANKPACK_DB or the user data directory)",
    )
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=OneLineArgumentParser
    )
    sub.required = True
    command = named_command(argv) if argv is not None else None
    modules = (COMMANDS[command],) if command in COMMANDS else COMMAND_MODULES
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


def flag_labels(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """dest -> how the user wrote it ('--rank-millis', 'CASE'), for the chosen sub-command."""
    labels: dict[str, str] = {}
    current: argparse.ArgumentParser | None = parser
    while current is not None:
        chosen: argparse.ArgumentParser | None = None
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(args, action.dest, None) or "")
            elif action.option_strings:
                longs = [o for o in action.option_strings if o.startswith("--")]
                labels[action.dest] = (longs or action.option_strings)[0]
            elif isinstance(action.metavar, str):
                labels[action.dest] = action.metavar
        current = chosen
    return labels


def _label(labels: dict[str, str], name: str) -> str:
    if name in labels:
        return labels[name]
    if name.isupper():  # an environment variable
        return name
    return name.replace("_", " ")


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM is handled like Ctrl-C: KeyboardInterrupt, cleanup, exit code 130.

    Commands that drive runs install their own handlers inside this (and restore ours).
    """

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (tests): leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def entry() -> NoReturn:
    """The process's entry point (the ``rankpack`` script, ``python -m rankpack``); `main`
    is the in-process one (tests call it)."""
    faulthandler.enable()  # a fatal signal prints every thread's stack, not just "Aborted"
    leave(main())


def leave(code: int) -> NoReturn:
    """End the process with ``code``. When daemon threads are still alive (the operator's
    Lease elector, its watch blocked in a read, a backend's pollers), the interpreter is not
    finalized around them: CPython tears modules and C libraries down while such a thread
    may still wake inside them, and an operator that had ended cleanly ("operator idle")
    once exited by SIGABRT that way in CI. Everything the command owns has been recorded
    and closed when its handler returns; the streams are flushed here, then the process
    ends at once. With no daemon thread left the exit is the ordinary one."""
    main_thread = threading.main_thread()
    others = [t for t in threading.enumerate() if t is not main_thread and t.is_alive()]
    if not others or any(not t.daemon for t in others):
        sys.exit(code)  # non-daemon threads are waited for, as Python always does
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with suppress(Exception):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list or os.environ.get("RANKPACK_DEBUG") == "1"
    with sigterm_as_interrupt():
        return _main(args_list, debug)


def _main(args_list: list[str], debug: bool) -> int:
    parser: argparse.ArgumentParser | None = None
    args: argparse.Namespace | None = None
    try:
        parser = build_parser(args_list)
        try:
            args = parser.parse_args(args_list)
        except SystemExit as exc:  # --help (0) or a usage error (2), already printed
            return exc.code if isinstance(exc.code, int) else 2
        code: int = args.handler(args)
        return code
    except InvalidQuantity as exc:
        if debug:
            raise
        labels = flag_labels(parser, args) if parser is not None and args is not None else {}
        message = " ".join(exc.render(lambda n: _label(labels, n)).split())
        print(f"rankpack: error: {message}", file=sys.stderr)
        return 2
    except UserError as exc:
        if debug:
            raise
        print(f"rankpack: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except BackendError as exc:
        # the cluster or the machine refused (unreachable apiserver, forbidden, ...)
        if debug:
            raise
        print(f"rankpack: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            raise
        print("rankpack: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`rankpack queue --json | head`): stop quietly, as `cat` does;
        # stdout goes to /dev/null so the interpreter's final flush cannot complain again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a killed writer


if __name__ == "__main__":  # pragma: no cover
    entry()
