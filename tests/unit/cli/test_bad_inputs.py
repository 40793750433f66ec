"""Table of distinct bad inputs across every sub-command (issue 12).

Each row runs the CLI in-process and asserts what the README promises for bad input: exit
code 2, a one-line error on stderr, no traceback, nothing created (the temporary home,
database and output directories are compared before and after). docs/reliability.md
lists the classes and counts; `test_table_is_large_and_distinct` keeps them honest.

``@W`` in an argument is replaced by the test's scratch directory, ``@CASE`` by a small
valid OpenFOAM case there (a 20x10 grid), and the other ``@NAME``s by the fixtures below.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pytest

from rankpack.cli import main
from tests.unit.case.meshgen import grid_mesh, write_case

MODEL_SHAPE = ["--ranks", "16", "--nodes", "12", "--cpus", "8"]
PREDICT = ["model", "predict", *MODEL_SHAPE, "--beta", "0.5"]
PLAN = ["model", "plan", *MODEL_SHAPE, "--beta", "0.5"]
FIT = ["model", "fit", *MODEL_SHAPE, "1:1249", "2:1410"]
PROGRAM = ["--", "/bin/true"]

BAD_COUNTS = ["0", "-1", "4097", "1000000000", "1e3", "1.5", "abc", "", "nan", "0x10", "1_000"]
BAD_ITERATIONS = ["0", "-5", "10000001", "1e9", "2.5", "x", "nan"]
BAD_CORES = ["0", "-2", "1e308", "nan", "inf", "-inf", "x", "0.5m", "1e-9", "100001", "2Gi"]
BAD_MILLIS = ["-1", "nan", "x", "0.1m", "1e308", "-5m", "inf"]


def _rows() -> list[tuple[str, list[str]]]:
    rows: list[tuple[str, list[str]]] = []

    def add(cls: str, *argvs: list[str]) -> None:
        rows.extend((cls, argv) for argv in argvs)

    # --- counts: ranks, iterations, repeat, count, concurrency, limits
    ranks_places = [
        ["plan", "--equal", "--ranks"],
        ["run", "pitzDaily", "--ranks"],
        ["submit", "pitzDaily", "--ranks"],
        ["demo", "--ranks"],
        ["decompose", "@CASE", "--ranks"],
        ["profile", *PROGRAM[:0], "--ranks"],
        ["model", "predict", "--nodes", "1", "--cpus", "8", "--beta", "0.5", "--ranks"],
    ]
    for place in ranks_places:
        for v in BAD_COUNTS:
            argv = [*place, v]
            if place[0] == "profile":
                argv = [*argv, *PROGRAM]
            add("count", argv)
    for place in (["run", "pitzDaily"], ["submit", "pitzDaily"], ["demo"]):
        for v in BAD_ITERATIONS:
            add("count", [*place, "--iterations", v])
    for v in ["0", "-1", "9", "x", "1.5"]:
        add("count", ["demo", "--refine", v])
    for v in ["0", "-1", "1001", "14000", "x", "2.5"]:
        add("count", ["submit", "pitzDaily", "--count", v])
    for v in ["0", "-1", "257", "x"]:
        add("count", ["multiplex", "--max-concurrent", v])
    for v in ["0", "-3", "x", "1e6"]:
        add("count", ["runs", "list", "--limit", v])
    for v in ["0", "-1", "1001", "x"]:
        add("count", [*PREDICT, "--max-n", v])
        add("count", [*PLAN, "--max-n", v])
    for v in ["0", "1001", "x"]:
        add("count", [*PREDICT, "--fitted-max-n", v])
        add("count", [*FIT, "--calibrate-on", v])
    for v in ["0", "-1", "100001", "x", "1.5"]:
        add(
            "count",
            ["model", "predict", "--ranks", "4", "--cpus", "8", "--beta", "1", "--nodes", v],
        )

    # --- CPU amounts (Kubernetes forms) and their bounds
    for place in (
        ["plan", "--weights", "1,1", "--budget"],
        ["run", "pitzDaily", "--budget"],
        ["submit", "pitzDaily", "--budget"],
        ["multiplex", "--budget"],
        [*PLAN, "--quota"],
    ):
        for v in BAD_CORES:
            add("cpu", [*place, v])
    for place in (
        ["plan", "--weights", "1,1", "--floor"],
        ["run", "pitzDaily", "--floor"],
        ["submit", "pitzDaily", "--floor"],
        ["profile", "--ranks", "2", "--request"],
        [*PLAN, "--rank-millis"],
    ):
        for v in BAD_MILLIS:
            argv = [*place, v]
            if place[0] == "profile":
                argv = [*argv, *PROGRAM]
            add("cpu", argv)
    add(
        "cpu",
        ["plan", "--weights", "1,1", "--budget", "0.1", "--floor", "60m"],
        ["plan", "--weights", "4096x1", "--budget", "1", "--floor", "1m"],
        [*PLAN, "--rank-millis", "0"],
    )

    # --- durations, fractions, prices, coefficients
    for v in ["0", "-1", "nan", "inf", "1e10", "x"]:
        add("number", ["profile", "--ranks", "2", "--seconds", v, *PROGRAM])
    for v in ["1", "-0.1", "nan", "2", "x"]:
        add("number", ["profile", "--ranks", "2", "--skip", v, *PROGRAM])
    for v in ["0", "nan", "-3", "1e12"]:
        add("number", ["multiplex", "--profile-s", v])
    for v in ["0", "nan", "-1", "1e308"]:
        add("number", [*PREDICT, "--t1", v])
        add("number", [*PLAN, "--t1", v])
    for v in ["1.5", "-0.1", "nan"]:
        add("number", [*PREDICT, "--duty", v])
    for v in ["-1", "nan", "inf", "1e308"]:
        add("number", ["model", "predict", *MODEL_SHAPE, "--beta", v])
        add("number", ["model", "plan", *MODEL_SHAPE, "--beta", v])
        add("number", [*PLAN, "--price-per-node-hour", v])
    for v in ["0", "-1", "nan", "1e308"]:
        add("number", [*PREDICT, "--duty-cycles", "16x0.1", "--mem-streams", v])
    for v in ["0", "-8", "nan", "inf", "2000"]:
        add(
            "number",
            ["model", "predict", "--ranks", "4", "--nodes", "1", "--beta", "1", "--cpus", v],
        )
    for v in ["1:nan", "1:0", "0:5", "x:1", "1:1e400", "1001:5", "1", "1:2:3", "1:-4", "2:inf"]:
        add("number", ["model", "fit", *MODEL_SHAPE, "1:1249", v])

    # --- lists: weights and duty cycles
    for v in ["", ",", "1,,2", "1e400", "nan", "0", "-1", "5000x1", "99999999999x1", "0x1", "1x",
              "x1", "1;2", "a", "1," * 5000]:  # fmt: skip
        add("list", ["plan", "--weights", v])
    for v in ["1.5", "-0.1", "nan", "5000x0.1", "x", "", "0x0.1", "150%", "16x0.1,"]:
        add("list", [*PREDICT, "--duty-cycles", v])
    add(
        "list",
        ["plan", "--weights", "1,1,5", "--ranks", "4"],
        ["run", "pitzDaily", "--ranks", "2", "--weights", "1,2,3"],
        ["submit", "pitzDaily", "--ranks", "2", "--weights", "1,2,3"],
        ["decompose", "@CASE", "--weights", "1,1,1", "--ranks", "2"],
        ["demo", "--weights", "1,2", "--ranks", "3"],
        [*PLAN, "--weights", "1,2"],
        [*PREDICT, "--duty-cycles", "0.1,0.2"],
    )

    # --- output locations
    for v in ["@FILE", "/proc/rankpack-x", "@FILE/sub", "@FULL", "/sys/rankpack-x", "@RO/x"]:
        add("path", ["run", "pitzDaily", "--workdir", v])
    for v in ["/proc/x.png", "@W", "@W/nodir/x.png", "@W/x.foo", "@FILE/x.png", "@W/", "@RO/x.png"]:
        add("path", ["decompose", "@CASE", "--weights", "1,2", "--plot", v])
    for v in ["@FULL", "/proc/x", "@W/nodir/x", "@FILE/x", "@FILE"]:
        add("path", ["decompose", "pitzDaily", "--ranks", "2", "--output", v])
    for v in ["/proc/x.png", "@FILE/x.png", "@W/x.txt"]:
        add("path", ["profile", "--ranks", "2", "--plot", v, *PROGRAM])
    for v in ["@FILE", "/proc/t", "@FILE/t"]:
        add("path", ["profile", "--ranks", "2", "--trace", v, *PROGRAM])
        add("path", ["profile", "--ranks", "2", "--workdir", v, *PROGRAM])
    for v in ["@FILE", "/proc/p", "@FILE/sub", "/sys/p"]:
        add("path", [*FIT, "--plot-dir", v])
        add("path", [*PLAN, "--plot-dir", v])
    for v in ["/proc/t.png", "@W", "@FILE/t.png"]:
        add("path", ["multiplex", "--plot", v])
    for v in ["@W", "/proc/x.db", "@FILE/x.db", "@RO/x.db"]:
        add("path", ["--db", v, "plan", "--weights", "1,1"])
        add("path", ["--db", v, "run", "pitzDaily"])
    add("path", ["--db", "@W", "submit", "pitzDaily"], ["--db", "@W", "demo"])
    add("path", ["--db", "/proc/x.db", "queue"], ["--db", "@FILE/x.db", "runs", "list"])
    add("path", ["--db", "/proc/x.db", "events"])
    for cmd in (
        ["runs", "list"],
        ["queue"],
        ["events"],
        ["runs", "show", "1"],
        ["plan", "--equal"],
    ):
        add("path", ["--db", "@FILE", *cmd])  # a text file is not a database: left untouched
    add("path", ["--db", "@CASE/system/controlDict", "submit", "pitzDaily"])

    # --- cases
    run_cases = ["@FIFOCASE", "@LOOPCASE", "@BROKENCASE", "@DIRLOOPCASE", "@FILE", "@NOCASE"]
    run_cases += ["@BADSOLVER", "/no/such/case", "noSuchTutorial", "a" * 5000, "@W/" + "b" * 300]
    for case in run_cases:
        add("case", ["run", case])
    for case in ["@FIFOCASE", "@LOOPCASE", "@DIRLOOPCASE", "@BADSOLVER", "@NOCASE"]:
        add("case", ["submit", case], ["demo", "--case", case])
    for case in ["@FIFOCASE", "@LOOPCASE", "@BROKENCASE", "@DIRLOOPCASE", "@NOCASE"]:
        add("case", ["decompose", case, "--ranks", "2"])

    # --- ids
    for v in ["0", "-1", "x", str(2**63), "1.5"]:
        add("id", ["runs", "show", v])
        add("id", ["profile", "--attach", v])
    for v in ["0", "x", "-2"]:
        add("id", ["events", "--sim", v], ["events", "--multiplex", v])

    # --- choices and combinations
    add(
        "usage",
        ["plan", "--weights", "1,1", "--qos", "bogus"],
        ["plan", "--equal", "--weights", "1,1", "--ranks", "2"],
        ["plan"],
        ["plan", "--equal"],
        ["run", "pitzDaily", "--decompose", "bogus"],
        ["run", "pitzDaily", "--qos", "limits"],
        ["run", "pitzDaily", "--center", "1,2"],
        ["run", "pitzDaily", "--center", "nan,0,0"],
        ["decompose", "@CASE", "--method", "concentric", "--ranks", "2"],
        ["decompose", "@CASE", "--method", "equal", "--weights", "1,2"],
        ["decompose", "@CASE", "--ranks", "300"],
        ["decompose", "@CASE", "--weights", "1,1", "--center", "inf,0,0"],
        ["decompose", "@CASE", "--weights", "1,1", "--center", "1e300,0,0"],
        ["run", "pitzDaily", "--decompose", "concentric", "--center", "0,0,-1e300"],
        ["decompose", "@CASE", "--ranks", "2", "--output", "@W/new"],
        ["decompose", "pitzDaily", "--ranks", "2"],
        ["profile", "--mpi", "bogus", "--ranks", "2", *PROGRAM],
        ["profile", "--ranks", "2", "--", "/no/such/program"],
        ["profile", "--attach", "5"],
        ["profile", "--ranks", "2"],
        ["profile", "--seconds", "1", *PROGRAM],
        ["model", "predict", *MODEL_SHAPE],
        ["model", "fit", *MODEL_SHAPE, "1:1249"],
        ["model", "fit", *MODEL_SHAPE, "2:1249", "3:1300"],
        ["model", "fit", *MODEL_SHAPE, "1:1249", "1:1300"],
        ["model", "plan", *MODEL_SHAPE, "1:1249", "2:1410", "--beta", "0.5"],
        ["model", "plan", *MODEL_SHAPE],
        ["model", "bogus"],
        ["model", "predict", "--ranks", "4096", "--nodes", "1", "--cpus", "1024",
         "--duty-cycles", ",".join(f"{(i % 997) / 1000 + 0.001:.4f}" for i in range(4096))],
        ["multiplex", "--wait", "bogus"],
        ["bogus"],
        [],
    )  # fmt: skip
    return rows


ROWS = _rows()


def test_table_is_large_and_distinct() -> None:
    keys = [tuple(argv) for _, argv in ROWS]
    assert len(set(keys)) == len(keys), [k for k, n in Counter(keys).items() if n > 1]
    assert len(keys) >= 200
    print(dict(Counter(cls for cls, _ in ROWS)), len(keys))


@pytest.fixture
def scratch(tmp_path: Path) -> dict[str, str]:
    w = tmp_path / "w"
    w.mkdir()
    (w / "afile").write_text("x")
    (w / "full").mkdir()
    (w / "full" / "x").write_text("x")
    case = write_case(w / "case", grid_mesh(20, 10))
    fifo = write_case(w / "fifocase", grid_mesh(2, 2))
    os.mkfifo(fifo / "constant" / "pipe")
    loop = write_case(w / "loopcase", grid_mesh(2, 2))
    (loop / "constant" / "a").symlink_to(loop / "constant" / "b")
    (loop / "constant" / "b").symlink_to(loop / "constant" / "a")
    broken = write_case(w / "brokencase", grid_mesh(2, 2))
    (broken / "constant" / "gone").symlink_to(w / "nothing-here")
    dirloop = write_case(w / "dirloopcase", grid_mesh(2, 2))
    (dirloop / "constant" / "up").symlink_to(dirloop)
    (w / "nocase").mkdir()
    bad = write_case(w / "badsolver", grid_mesh(2, 2))
    cd = bad / "system" / "controlDict"
    cd.write_text(cd.read_text().replace("simpleFoam", "noSuchSolverFoam"))
    return {
        "@FIFOCASE": str(fifo),
        "@LOOPCASE": str(loop),
        "@BROKENCASE": str(broken),
        "@DIRLOOPCASE": str(dirloop),
        "@BADSOLVER": str(bad),
        "@NOCASE": str(w / "nocase"),
        "@CASE": str(case),
        "@FILE": str(w / "afile"),
        "@FULL": str(w / "full"),
        "@RO": "/proc/sys",
        "@W": str(w),
    }


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            out[os.path.relpath(path, root)] = (st.st_mode, st.st_size)
    return out


def substitute(argv: list[str], names: dict[str, str]) -> list[str]:
    pattern = re.compile("|".join(sorted(map(re.escape, names), key=len, reverse=True)))
    return [pattern.sub(lambda m: names[m.group(0)], a) for a in argv]


@pytest.mark.parametrize(
    ("cls", "argv"), ROWS, ids=[f"{i:03d}-{c}-{' '.join(a)[:60]}" for i, (c, a) in enumerate(ROWS)]
)
def test_bad_input(
    cls: str,
    argv: list[str],
    scratch: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    real = substitute(argv, scratch)
    before = snapshot(tmp_path)
    code = main(real)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert snapshot(tmp_path) == before, "something was created or changed on exit 2"


ENV_ROWS: list[tuple[dict[str, str], list[str]]] = [
    ({"RANKPACK_HOME": "@FILE"}, ["run", "pitzDaily"]),
    ({"RANKPACK_HOME": "@FILE/sub"}, ["run", "pitzDaily"]),
    ({"RANKPACK_HOME": "/proc/rankpack"}, ["run", "pitzDaily"]),
    ({"RANKPACK_HOME": "/sys/rankpack"}, ["demo"]),
    ({"RANKPACK_HOME": "@FILE"}, ["profile", "pitzDaily", "--ranks", "2"]),
    ({"RANKPACK_DB": "@W"}, ["run", "pitzDaily"]),
    ({"RANKPACK_DB": "@W"}, ["demo"]),
    ({"RANKPACK_DB": "@W"}, ["submit", "pitzDaily"]),
    ({"RANKPACK_DB": "/proc/x.db"}, ["run", "pitzDaily"]),
    ({"RANKPACK_DB": "/proc/x.db"}, ["queue"]),
    ({"RANKPACK_DB": "@FILE/x.db"}, ["runs", "list"]),
    ({"RANKPACK_DB": "@FILE/x.db"}, ["model", "fit", *MODEL_SHAPE, "--from-db"]),
]


@pytest.mark.parametrize(("env", "argv"), ENV_ROWS, ids=[" ".join(a) for _, a in ENV_ROWS])
def test_bad_environment(
    env: dict[str, str],
    argv: list[str],
    scratch: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, substitute([value], scratch)[0])
    before = snapshot(tmp_path)
    code = main(substitute(argv, scratch))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert next(iter(env)) in err, err  # the message names the variable
    assert snapshot(tmp_path) == before
