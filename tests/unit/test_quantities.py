"""The validation layer (rankpack.quantities, rankpack.paths) on its own: accepted forms,
bounds, messages, and that the pure layers never name a command-line flag."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankpack import paths, quantities
from rankpack.model.contention import check_beta, parse_point
from rankpack.model.overlap import check_predictor_size, parse_duty_cycles
from rankpack.model.pareto import PlanInputs, RequestBudget, plan_capacity, request_budget
from rankpack.model.shape import ClusterShape
from rankpack.plan.allocation import (
    budget_to_millis,
    parse_weights,
    proportional_millis,
    resolve_weights,
)
from rankpack.quantities import InvalidQuantity


@pytest.mark.parametrize(
    ("text", "millis"),
    [("2", 2000), ("1.5", 1500), ("500m", 500), ("0.25", 250), ("1e3m", 1000), (".5", 500),
     ("100000", 100_000_000), ("0", 0), ("  750m ", 750), ("2.0", 2000), ("+1", 1000)],
)  # fmt: skip
def test_cpu_quantities_in_kubernetes_forms(text: str, millis: int) -> None:
    assert quantities.cpu_millis(text, "budget") == millis


@pytest.mark.parametrize(
    "text",
    ["nan", "inf", "-1", "1e308", "0.5m", "1Gi", "2 cores", "", "m", "1e-9", "100001", "1,5"],
)
def test_cpu_quantities_refused(text: str) -> None:
    with pytest.raises(InvalidQuantity) as info:
        quantities.cpu_millis(text, "budget")
    assert "budget" in str(info.value) and "--" not in str(info.value)


def test_cpu_numbers_are_cores_and_bounded() -> None:
    assert quantities.cpu_cores(0.5, "quota") == 0.5
    for bad in (math.nan, math.inf, 1e308, -1.0, 0.0):
        with pytest.raises(InvalidQuantity):
            quantities.cpu_cores(bad, "quota")


@pytest.mark.parametrize("text", ["0", "4097", "1e3", "1.0", "1_000", "٣", "0x10", " ", "-4"])
def test_ranks_refused(text: str) -> None:
    with pytest.raises(InvalidQuantity, match="ranks"):
        quantities.ranks(text)


def test_bounds_are_inclusive() -> None:
    assert quantities.ranks("4096") == quantities.MAX_RANKS
    assert quantities.iterations(str(10**7)) == quantities.MAX_ITERATIONS
    assert quantities.fraction("1", "duty") == 1.0
    with pytest.raises(InvalidQuantity):
        quantities.fraction("1", "skip", hi_open=True)
    assert quantities.seconds("0", "s", allow_zero=True) == 0.0
    with pytest.raises(InvalidQuantity):
        quantities.seconds("0", "s")


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_every_real_is_finite_and_in_range_or_refused(x: float) -> None:
    try:
        v = quantities.real(x, "v", lo=-5, hi=5)
    except InvalidQuantity:
        assert not (math.isfinite(x) and -5 <= x <= 5)
    else:
        assert math.isfinite(v) and -5 <= v <= 5


@given(st.text(max_size=30))
def test_cpu_parser_never_raises_anything_else(text: str) -> None:
    try:
        m = quantities.cpu_millis(text, "budget")
    except InvalidQuantity:
        return
    assert 0 <= m <= quantities.MAX_MILLIS


def test_render_substitutes_placeholders_only() -> None:
    exc = InvalidQuantity("{weights} has 3 values but {ranks} is 4; weight '{x}'")
    assert str(exc) == "weights has 3 values but ranks is 4; weight 'x'"
    assert exc.render(lambda n: f"--{n}") == "--weights has 3 values but --ranks is 4; weight '--x'"
    assert quantities.literal("a{b}\n" + "c" * 100).startswith("'a?b??")


PURE_ERRORS: list[Callable[[], object]] = [
    lambda: parse_weights("1,-1"),
    lambda: parse_weights("5000x1"),
    lambda: parse_weights(""),
    lambda: budget_to_millis(math.nan),
    lambda: budget_to_millis(1e308),
    lambda: proportional_millis([1, 1], 100, 60),
    lambda: resolve_weights("1,2,3", 4, False),
    lambda: resolve_weights(None, None, True),
    lambda: resolve_weights("1", 1, True),
    lambda: ClusterShape(0, 1, 8),
    lambda: ClusterShape(1, 0, 8),
    lambda: ClusterShape(1, 1, math.nan),
    lambda: ClusterShape(5000, 1, 8),
    lambda: check_beta(-1),
    lambda: parse_point("1:nan"),
    lambda: parse_point("x"),
    lambda: parse_duty_cycles("2"),
    lambda: parse_duty_cycles("5000x0.1"),
    lambda: request_budget([1, 2], 3, 1000),
    lambda: request_budget(None, 3, 0),
    lambda: check_predictor_size(1000, [i / 5000 for i in range(4096)], ClusterShape(4096, 1, 8)),
    lambda: plan_capacity([1.0], PlanInputs(ClusterShape(1, 1, 8), RequestBudget(1, 1), n_max=0)),
]


@pytest.mark.parametrize("call", PURE_ERRORS)
def test_pure_layers_raise_domain_errors_without_flag_names(call: Callable[[], object]) -> None:
    with pytest.raises(InvalidQuantity) as info:
        call()
    assert "--" not in str(info.value)


def test_paths_refuse_files_proc_and_missing_parents(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    for bad in (str(f), "/proc/x", "/sys/x", str(f / "sub")):
        with pytest.raises(InvalidQuantity):
            paths.output_dir(bad, "dir")
    for bad in (str(tmp_path), "/proc/x.png", str(tmp_path / "no" / "x.png"), str(f / "x")):
        with pytest.raises(InvalidQuantity):
            paths.output_file(bad, "plot")
    with pytest.raises(InvalidQuantity, match="already exists"):
        paths.new_dir(str(tmp_path), "output")
    assert paths.output_dir(str(tmp_path / "a" / "b"), "dir") == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists(), "a check created something"
    assert paths.output_file(str(tmp_path / "x.png"), "plot") == tmp_path / "x.png"


def test_read_only_mount_is_refused() -> None:
    mount = paths.mount_of("/proc/sys")
    assert mount is not None and mount.fstype in paths.PSEUDO_FILESYSTEMS
    with pytest.raises(InvalidQuantity, match="kernel filesystem"):
        paths.output_file("/proc/sys/x.db", "db", parent_must_exist=False)


def test_check_tree_refuses_fifo_loops_and_broken_links(tmp_path: Path) -> None:
    ok = tmp_path / "ok"
    (ok / "a").mkdir(parents=True)
    (ok / "a" / "f").write_text("x")
    (ok / "link").symlink_to(ok / "a")
    paths.check_tree(ok)
    cases = {
        "fifo": lambda d: os.mkfifo(d / "p"),
        "loop": lambda d: (d / "l1").symlink_to(d / "l1"),
        "broken": lambda d: (d / "b").symlink_to(d / "missing"),
        "up": lambda d: (d / "up").symlink_to(d),
    }
    for name, make in cases.items():
        d = tmp_path / name
        d.mkdir()
        make(d)
        with pytest.raises(InvalidQuantity):
            paths.check_tree(d)
    deep = tmp_path / "deep"
    p = deep
    for _ in range(paths.MAX_CASE_DEPTH + 2):
        p = p / "d"
    p.mkdir(parents=True)
    with pytest.raises(InvalidQuantity, match="deep"):
        paths.check_tree(deep)
