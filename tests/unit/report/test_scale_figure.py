"""The scale benchmark's figure: fill over time of each run, drawn from its JSON."""

from __future__ import annotations

from rankpack.report.figures import scale_fill_png


def test_fill_over_time_is_drawn_for_finished_and_stopped_runs() -> None:
    runs = [
        {"nodes": 10, "sims": 5, "ranks": "16", "fill_at_5min": 1.0, "makespan_over_bound": 1.02,
         "fill_series": [[0.0, 0.0], [60.0, 0.5], [300.0, 1.0], [900.0, 0.0]]},
        {"nodes": 1000, "sims": 200, "ranks": "64", "fill_at_5min": 0.02,
         "makespan_over_bound": None, "fill_series": [[0.0, 0.0], [3600.0, 0.09]]},
        {"nodes": 1, "sims": 1, "ranks": "1", "fill_series": []},
    ]  # fmt: skip
    png = scale_fill_png(runs)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
