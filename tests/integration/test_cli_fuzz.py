"""Property-based fuzz of every sub-command's arguments (issue 12).

Hypothesis draws argument lists for each sub-command from valid values, boundary values
and junk (NaN, inf, huge numbers, negative numbers, text, paths that are files, under
/proc, missing parents, ...). Each list runs in a long-lived child process
(``cli_worker.py``) under an address-space limit and a per-call timer. The properties:

- the exit code is 0 or 2 (or the arguments were valid enough to reach the real work,
  which the worker replaces; see cli_worker.py), never 1, a timeout or an exception;
- no traceback on stderr, and an error is one line;
- time and memory stay bounded (the limits below);
- on exit 2 nothing was created in the scratch home, database and output directories.
  (Exception, for the commands whose database handling the store rework owns — runs,
  queue, events, multiplex, submit, profile --attach: the database file itself is not
  compared yet; the store still writes its tables into any existing file.)

``RANKPACK_FUZZ_EXAMPLES`` sets the number of examples (default 150, a few seconds);
docs/reliability.md records a longer run. In the integration tier: the worker is a real
process (the address-space limit cannot be set on the test process itself).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.unit.case.meshgen import grid_mesh, write_case

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("RANKPACK_FUZZ_EXAMPLES", "150"))
ADDRESS_SPACE = 4 << 30
"""RLIMIT_AS of the worker: a 24 GB allocation (issue 12's `plan --ranks 1e9`) fails."""
CALL_TIMEOUT_S = 60.0
"""Per call, generous for a loaded 2-core machine; a model search that runs for minutes fails."""
MAX_RSS_KB = 2_000_000
STORE_COMMANDS = {"runs", "queue", "events", "multiplex", "submit"}

JUNK_VALUES = [
    "0", "-1", "1", "2", "4", "16", "4096", "4097", "1e308", "-1e308", "nan", "NaN", "inf",
    "-inf", "1e-9", "0.5", "1.5", "500m", "0.5m", "2Gi", "1_000", "0x10", "", " ", "abc",
    "99999999999999999999999", "1e400", "٣", "1,2", "8x1", "-", "--", "@W/out", "@FILE",
    "/proc/x", "%", "1:2", "1.0", "+3", "1e3",
]  # fmt: skip
PATHS = [
    "@W/new", "@W/new.png", "@W/plots", "@FILE", "@FILE/x", "@FILE/x.png", "/proc/x",
    "/proc/x.png", "/sys/x", "@W", "@W/nodir/x.png", "@W/nodir/sub", "@FULL", "@W/x.foo",
    "/proc/sys/x.db", "", "@W/" + "n" * 300,
]  # fmt: skip
CASES = ["@CASE", "@FIFOCASE", "@LOOPCASE", "pitzDaily", "noSuchTutorial", "@FILE", "@W", ""]

text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=10,
)
junk = st.one_of(
    st.sampled_from(JUNK_VALUES),
    text,
    st.integers(-(10**15), 10**15).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


def valid_or_junk(*valid: str) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(valid), junk)


COUNT = valid_or_junk("1", "2", "4", "16")
CPU = valid_or_junk("1", "2", "4", "500m", "1.5", "0.25", "100m")
SECONDS = valid_or_junk("0.5", "1", "10", "1249")
FRACTION = valid_or_junk("0", "0.1", "0.5", "0.99")
WEIGHTS = valid_or_junk("1,1,5,15", "1,1", "4x1", "8x1,4x5,4x15", "1,2")
DUTIES = valid_or_junk("16x0.1", "8x0.05,4x0.115,4x0.194", "4x0.2", "0.1,0.2")
PATH = st.one_of(st.sampled_from(PATHS), text)
POINT = valid_or_junk("1:1249", "2:1410", "3:1446", "4:1604", "1:100", "2:120")

# per command: positional argument strategies and optional flags -> value strategy (None: a
# switch)
MODEL_SHAPE = {"--ranks": COUNT, "--nodes": COUNT, "--cpus": SECONDS}
COMMANDS: dict[tuple[str, ...], tuple[list[st.SearchStrategy[str]], dict[str, Any]]] = {
    ("plan",): ([], {"--weights": WEIGHTS, "--equal": None, "--ranks": COUNT, "--budget": CPU,
                     "--floor": CPU, "--qos": valid_or_junk("requests", "limits"),
                     "--json": None}),
    ("decompose",): ([st.sampled_from(CASES)], {
        "--ranks": COUNT, "--weights": WEIGHTS, "--center": valid_or_junk("0,0,0", "1,2,0"),
        "--method": valid_or_junk("equal", "weighted", "concentric"), "--plot": PATH,
        "--output": PATH, "--no-decompose-par": None, "--json": None,
        "--write-processor-weights": None}),
    ("run",): ([st.sampled_from(CASES)], {
        "--ranks": COUNT, "--weights": WEIGHTS, "--budget": CPU, "--floor": CPU,
        "--iterations": COUNT, "--workdir": PATH, "--decompose": valid_or_junk("equal", "weighted"),
        "--center": valid_or_junk("0,0,0"), "--qos": valid_or_junk("requests", "limits"),
        "--allow-limits": None, "--no-shim": None, "--no-cgroups": None, "--json": None,
        "--wait": valid_or_junk("spin", "polite")}),
    ("demo",): ([], {"--case": st.sampled_from(CASES), "--ranks": COUNT, "--weights": WEIGHTS,
                     "--iterations": COUNT, "--refine": COUNT, "--quick": None,
                     "--output": PATH, "--json": None}),
    ("report",): ([COUNT], {"--multiplex": COUNT, "--output": PATH, "--json": None}),
    ("submit",): ([st.sampled_from(CASES)], {
        "--ranks": COUNT, "--weights": WEIGHTS, "--budget": CPU, "--floor": CPU,
        "--iterations": COUNT, "--count": COUNT, "--json": None}),
    ("queue",): ([], {"--all": None, "--json": None}),
    ("runs", "list"): ([], {"--limit": COUNT, "--json": None}),
    ("runs", "show"): ([COUNT], {"--json": None}),
    ("events",): ([], {"--sim": COUNT, "--multiplex": COUNT, "--json": None}),
    ("multiplex",): ([], {"--max-concurrent": COUNT, "--budget": CPU, "--profile-s": SECONDS,
                          "--plot": PATH, "--dry-run": None, "--json": None}),
    ("profile",): ([], {"--ranks": COUNT, "--seconds": SECONDS, "--skip": FRACTION,
                        "--request": CPU, "--plot": PATH, "--trace": PATH, "--workdir": PATH,
                        "--attach": COUNT, "--json": None}),
    ("model", "fit"): ([POINT, POINT, POINT], {**MODEL_SHAPE, "--calibrate-on": COUNT,
                                               "--duty-cycles": DUTIES, "--mem-streams": SECONDS,
                                               "--plot-dir": PATH, "--json": None}),
    ("model", "predict"): ([], {**MODEL_SHAPE, "--beta": FRACTION, "--t1": SECONDS,
                                "--max-n": COUNT, "--fitted-max-n": COUNT, "--duty": FRACTION,
                                "--duty-cycles": DUTIES, "--mem-streams": SECONDS,
                                "--json": None}),
    ("model", "plan"): ([POINT, POINT], {**MODEL_SHAPE, "--beta": FRACTION, "--t1": SECONDS,
                                         "--weights": WEIGHTS, "--rank-millis": CPU,
                                         "--quota": CPU, "--max-n": COUNT,
                                         "--price-per-node-hour": SECONDS,
                                         "--allocation": valid_or_junk("equal", "proportional"),
                                         "--duty-cycles": DUTIES, "--plot-dir": PATH,
                                         "--json": None}),
}  # fmt: skip


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    command = draw(st.sampled_from(sorted(COMMANDS)))
    positional, flags = COMMANDS[command]
    argv = list(command)
    chosen = draw(st.lists(st.sampled_from(sorted(flags)), unique=True, max_size=6))
    for flag in chosen:
        argv.append(flag)
        if flags[flag] is not None:
            argv.append(draw(flags[flag]))
    n_pos = draw(st.integers(0, len(positional))) if command[0] == "model" else len(positional)
    argv += [draw(s) for s in positional[:n_pos]]
    if command == ("profile",) and draw(st.booleans()):
        argv += ["--", draw(st.sampled_from(["/bin/true", "/no/such", "true", "@FILE"]))]
    if draw(st.booleans()):
        argv = ["--db", draw(st.sampled_from(["@W/db.sqlite", *PATHS])), *argv]
    return argv


def _pythonpath(repo: Path) -> list[str]:
    """The repository (for ``tests``) before the test process's own path (for the tree
    of rankpack under test)."""
    return [str(repo), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]


class Worker:
    def __init__(self) -> None:
        here = Path(__file__).parent
        self.proc = subprocess.Popen(
            [sys.executable, str(here / "cli_worker.py"), str(ADDRESS_SPACE), str(CALL_TIMEOUT_S)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(_pythonpath(here.parent.parent))},
        )

    def call(self, argv: list[str], env: dict[str, str], cwd: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"argv": argv, "env": env, "cwd": cwd}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the worker died (exit {self.proc.poll()}) on {argv!r}"
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    w = Worker()
    yield w
    w.close()


def _scratch(root: Path) -> dict[str, str]:
    w = root / "w"
    w.mkdir()
    (w / "afile").write_text("x")
    (w / "full").mkdir()
    (w / "full" / "x").write_text("x")
    write_case(w / "case", grid_mesh(6, 4))
    fifo = write_case(w / "fifocase", grid_mesh(2, 2))
    os.mkfifo(fifo / "constant" / "pipe")
    loop = write_case(w / "loopcase", grid_mesh(2, 2))
    (loop / "constant" / "up").symlink_to(loop)
    return {
        "@CASE": str(w / "case"),
        "@FIFOCASE": str(fifo),
        "@LOOPCASE": str(loop),
        "@FILE": str(w / "afile"),
        "@FULL": str(w / "full"),
        "@W": str(w),
    }


def _tree_modes(root: Path, skip: str | None) -> dict[str, tuple[int, int]]:
    """Every entry under ``root``: mode and size; ``skip``: a database file not compared."""
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if skip is not None and path.startswith(skip):
                continue
            info = os.lstat(path)
            size = 0 if os.path.isdir(path) else info.st_size
            out[os.path.relpath(path, root)] = (info.st_mode, size)
    return out


def _substitute(argv: list[str], names: dict[str, str]) -> list[str]:
    out = []
    for a in argv:
        for key in sorted(names, key=len, reverse=True):
            a = a.replace(key, names[key])
        out.append(a)
    return out


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=os.environ.get("RANKPACK_FUZZ_RANDOM") != "1",
)
@given(argv=command_lines())
def test_fuzz_every_subcommand(argv: list[str], worker: Worker) -> None:
    with tempfile.TemporaryDirectory(prefix="rankpack-fuzz-") as tmp:
        root = Path(tmp)
        names = _scratch(root)
        home = root / "home"
        env = {
            "RANKPACK_HOME": str(home),
            "RANKPACK_DB": str(names["@W"] + "/db.sqlite"),
            "HOME": str(root / "userhome"),
        }
        real = _substitute(argv, names)
        skip_db: str | None = None
        command = argv[2] if argv[0] == "--db" else argv[0]
        if (
            command in STORE_COMMANDS or "--attach" in argv
        ):  # the store rework owns "never creates a database"
            given = real[1] if argv[0] == "--db" else env["RANKPACK_DB"]
            # only a plain file path is exempt (never "" or a directory, which hide all)
            if os.path.isabs(given) and not os.path.isdir(given) and not given.endswith("/"):
                top = Path(given)  # with the directories the store makes for it
                while not top.parent.exists() and top.parent != top:
                    top = top.parent
                skip_db = str(top)
        before = _tree_modes(root, skip_db)
        reply = worker.call(real, env, names["@W"])
        code, err = reply["code"], reply["stderr"]
        event(f"{' '.join(argv[2:4] if argv[0] == '--db' else argv[:2])[:20]} -> exit {code}")
        assert code in (0, 2, "work"), (real, code, err)
        assert "Traceback" not in err, (real, err)
        assert reply["maxrss_kb"] < MAX_RSS_KB, (real, reply["maxrss_kb"])
        if code == 2:
            lines = [line for line in err.splitlines() if not line.startswith("rankpack: warning:")]
            assert len(lines) == 1, (real, err)
            assert _tree_modes(root, skip_db) == before, (real, err)
