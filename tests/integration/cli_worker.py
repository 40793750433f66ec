"""A child process that runs `rankpack.cli.main` on argument lists sent to it, under limits.

Used by the fuzz test (test_cli_fuzz.py). Started once; it sets an address-space limit
(RLIMIT_AS), then for each request (one JSON line: argv, env, cwd) runs the CLI in-process
with an interval timer and answers one JSON line: exit code, stderr, seconds, peak RSS.

Work that real, valid arguments would start (copying and meshing a case, launching MPI
ranks, running OpenFOAM tools) is replaced by raising `ReachedWork`: the fuzz is about
argument handling, and "valid, would start work" is answered as code ``"work"``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import sys
import time
from typing import Any


class ReachedWork(BaseException):
    """Valid arguments got as far as the real work."""


class Timeout(BaseException):
    pass


def _reached(*args: Any, **kwargs: Any) -> Any:
    raise ReachedWork


def _patch() -> None:
    import rankpack.backend.local as local
    import rankpack.case.decomposition as decomposition
    import rankpack.case.openfoam as openfoam

    local.LocalBackend.stage = _reached  # type: ignore[assignment]
    openfoam.run_tool = _reached  # type: ignore[assignment]
    decomposition.openfoam_decompose = _reached  # type: ignore[assignment]
    local.LocalBackend.launch = _reached  # type: ignore[assignment]


def _alarm(signum: int, frame: object) -> None:
    raise Timeout


def main() -> None:
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 4 << 30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    timeout_s = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    from rankpack.cli import main as cli_main

    _patch()
    signal.signal(signal.SIGALRM, _alarm)
    for line in sys.stdin:
        req = json.loads(line)
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        out, err = io.StringIO(), io.StringIO()
        t0 = time.monotonic()
        code: int | str
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = cli_main(req["argv"])
        except ReachedWork:
            code = "work"
        except Timeout:
            code = "timeout"
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else str(exc.code)
        except BaseException as exc:  # reported, not raised: the test fails on it
            code = f"exception {type(exc).__name__}: {exc}"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        reply = {
            "code": code,
            "stderr": err.getvalue(),
            "seconds": time.monotonic() - t0,
            "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        }
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
