"""Runs mpi4py's own test suite in one MPI rank and writes every test's outcome as JSON.

Started by tests/peer/test_mpi4py.py under ``mpirun`` (one copy per rank):

    python run_mpi4py.py MPI4PY_TEST_DIR OUT_DIR [main.py options...]

It is mpi4py's ``test/main.py`` (the suite's own runner and options) with one change: the
result object also records ``test id -> outcome`` (pass, fail, error, skip, xfail, xpass),
written to ``OUT_DIR/rank-<r>.json`` when the run ends, so that runs with and without the
shim can be compared test by test and rank by rank.
"""

from __future__ import annotations

import json
import sys
import unittest
from pathlib import Path
from typing import Any


class RecordingResult(unittest.TextTestResult):
    outcomes: dict[str, str]

    def startTestRun(self) -> None:
        self.outcomes = {}
        super().startTestRun()

    def addSuccess(self, test: unittest.TestCase) -> None:
        self.outcomes[test.id()] = "pass"
        super().addSuccess(test)

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        self.outcomes[test.id()] = "fail"
        super().addFailure(test, err)

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        self.outcomes[test.id()] = "error"
        super().addError(test, err)

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        self.outcomes[test.id()] = "skip"
        super().addSkip(test, reason)

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:
        self.outcomes[test.id()] = "xfail"
        super().addExpectedFailure(test, err)

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        self.outcomes[test.id()] = "xpass"
        super().addUnexpectedSuccess(test)

    def addSubTest(self, test: unittest.TestCase, subtest: Any, err: Any) -> None:
        if err is not None:
            failed = issubclass(err[0], test.failureException)
            self.outcomes[subtest.id()] = "fail" if failed else "error"
        super().addSubTest(test, subtest, err)

    def stopTestRun(self) -> None:
        super().stopTestRun()
        from mpi4py import MPI  # imported (and initialised) by main.py by now

        out = Path(OUT_DIR) / f"rank-{MPI.COMM_WORLD.Get_rank()}.json"
        out.write_text(json.dumps({"tests_run": self.testsRun, "outcomes": self.outcomes}))


class RecordingRunner(unittest.TextTestRunner):
    """A class, not an instance: main.py's options (-q, -v, -f) still configure it."""

    resultclass = RecordingResult


OUT_DIR = ""


def main() -> None:
    global OUT_DIR
    test_dir, OUT_DIR, *options = sys.argv[1:]
    sys.path.insert(0, test_dir)
    sys.dont_write_bytecode = True
    import main as mpi4py_main  # mpi4py's test/main.py

    sys.argv = [str(Path(test_dir) / "main.py"), *options]
    mpi4py_main.TestProgram(module=None, testRunner=RecordingRunner)


if __name__ == "__main__":
    main()
