"""Reports of real runs opened in a real browser (headless Debian Chromium, tests/browser.py),
and the demo from start to end.

Each page is checked for every figure (decoded: the image has pixels) and every table, no
console errors, no request other than the page itself and its data: URIs, and a screenshot
that is not blank. The first test shows the harness would see each of those faults.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.browser import CHROMIUM, PageVisit, blank_fraction, visit
from tests.cli_runner import rankpack
from tests.integration.helpers import run_json

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (setup.sh test)"),
]

RUN_FIGURES = ("requests", "cpu", "duty", "throttling", "progress")
RUN_TABLES = ("ranks", "resizes", "events")


def _assert_clean_page(v: PageVisit, figures: list[str], tables: list[str]) -> None:
    assert v.errors == [], v.errors
    assert v.checks["scripts"] == 0
    assert [f["id"] for f in v.checks["figures"]] == figures
    broken = [f for f in v.checks["figures"] if not f["complete"] or f["width"] < 100
              or f["height"] < 100 or f["src"] != "data:image/png;base64,"]  # fmt: skip
    assert broken == [], broken
    assert [t["id"] for t in v.checks["tables"]] == tables
    others = [u for u in v.requests if u != v.url and not u.startswith("data:")]
    assert others == [], others
    same, colours = blank_fraction(v.screenshot)
    assert same < 0.9 and colours > 50, (same, colours)


def test_the_harness_sees_console_errors_failed_loads_fetches_and_blank_pages(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!DOCTYPE html><html><body><p>x</p>"
        '<img src="missing.png"><img src="https://rankpack.invalid/x.png">'
        "<script>console.error('boom from console.error');"
        "throw new Error('thrown on purpose');</script></body></html>"
    )
    v = visit(bad, settle_s=2.0)
    texts = " | ".join(m["text"] for m in v.errors)
    assert "boom from console.error" in texts
    assert "thrown on purpose" in texts
    assert any("Failed to load resource" in m["text"] for m in v.errors), v.console
    assert "https://rankpack.invalid/x.png" in v.requests
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    w = visit(blank)
    assert w.errors == []
    same, colours = blank_fraction(w.screenshot)
    assert same > 0.99 and colours < 5, (same, colours)


def test_report_of_a_real_run_in_a_browser(tmp_path: Path) -> None:
    run = run_json(
        "run", "pitzDaily", "--ranks", "2", "--weights", "1,1", "--decompose", "weighted",
        "--decompose-weights", "1,3", "--iterations", "150", "--resize", "duty",
    )  # fmt: skip
    assert run["status"] == "completed", run
    rid = run["id"]
    t0 = time.monotonic()
    out = tmp_path / "report.html"
    proc = rankpack("report", str(rid), "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    written = json.loads(proc.stdout)
    took = time.monotonic() - t0
    expected = [f"run{rid}-{k}" for k in RUN_FIGURES]
    assert written["figures"] == expected and len(written["pngs"]) == 5
    assert all(Path(p).stat().st_size > 5000 for p in written["pngs"])
    v = visit(out)
    _assert_clean_page(v, expected, [f"run{rid}-{k}" for k in RUN_TABLES])
    text = v.checks["text"]
    assert "Requests and resizes" in text and "Duty-cycle heat-map" in text
    assert "no duty cycles recorded" not in text  # the shim measured them
    assert "solver log not found" not in text  # residuals came from the run's log
    print(f"report of run {rid}: {took:.1f} s to write (measured under load)")


def test_demo_quick_tells_the_story_and_writes_a_report(
    tmp_path: Path, isolated_home: Path
) -> None:
    t0 = time.monotonic()
    story = run_json("demo", "--quick", timeout=1500)
    took = time.monotonic() - t0
    assert story["_returncode"] == 0, story
    assert story["interrupted"] is False and story["failed"] is None
    hazard = story["hazard"]
    req, lim = hazard["runs"]["requests"], hazard["runs"]["limits"]
    assert hazard["plan_millis"] == [250, 750]
    assert req["throttled"] == 0 and req["status"] == "completed" and req["iterations"] == 10
    assert lim["throttled"] > 0  # the same plan as limits is throttled
    assert hazard["slowdown"] is not None and hazard["slowdown"] > 0
    ranks = story["ranks"]
    assert ranks["status"] == "completed" and ranks["restarts"] == 0
    assert all(r["duty"] is not None and 0 < r["duty"] <= 1 for r in ranks["ranks"])
    assert [r["cells"] for r in ranks["ranks"]] == [12225, 36675]  # 48 900 cells, 1:3
    assert any(z["status"] == "completed" and z["kind"] == "size" for z in ranks["resizes"])
    payoff = story["payoff"]
    assert payoff["status"] == "completed" and payoff["baseline"] == "db"
    assert isinstance(payoff["gain"], float) and payoff["gain"] > 0
    assert isinstance(payoff["limit"], float) and 1 <= payoff["limit"] <= 2
    assert payoff["session"]["simulations"] and len(payoff["session"]["simulations"]) == 2
    headline = story["summary"]["headline"]
    assert f"{payoff['gain']:.2f}x" in headline and f"{payoff['limit']:.2f}x" in headline
    assert "easured once" in story["summary"]["lines"][-1]
    html = Path(story["report_html"])
    assert html.is_file() and (html.parent / "report_figures").is_dir()
    run_ids = [lim["run_id"], req["run_id"], ranks["run_id"]]
    sims = [s["id"] for s in payoff["session"]["simulations"]]
    mid = payoff["multiplex_id"]
    figures = [f"run{r}-{k}" for r in run_ids for k in RUN_FIGURES]
    figures += [f"session{mid}-timeline", f"session{mid}-gain"]
    figures += [f"run{r}-{k}" for r in sorted(sims) for k in RUN_FIGURES]
    tables = [f"run{r}-{k}" for r in run_ids for k in RUN_TABLES]
    tables += [f"session{mid}-simulations", f"session{mid}-events"]
    tables += [f"run{r}-{k}" for r in sorted(sims) for k in RUN_TABLES]
    v = visit(html)
    _assert_clean_page(v, figures, tables)
    assert headline in " ".join(v.checks["text"].split())
    assert os.environ["RANKPACK_HOME"] == str(isolated_home)
    print(f"demo --quick: {took:.0f} s (measured under load); {headline}")
