"""bench/scale.py's reference for the makespan: list scheduling of rigid simulations."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

from hypothesis import given
from hypothesis import strategies as st


def _scale() -> ModuleType:
    path = Path(__file__).resolve().parents[3] / "bench" / "scale.py"
    spec = importlib.util.spec_from_file_location("bench_scale", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


scale = _scale()

jobs = st.lists(st.tuples(st.floats(1.0, 1000.0), st.integers(1, 8)), min_size=1, max_size=30)


@given(jobs, st.integers(8, 32))
def test_the_ideal_makespan_is_between_the_bound_and_one_after_another(
    js: list[tuple[float, int]], cores: int
) -> None:
    durations, widths = [d for d, _ in js], [w for _, w in js]
    end = scale.ideal_makespan(durations, widths, cores, range(len(js)))
    bound = max(sum(d * w for d, w in js) / cores, max(durations))
    assert bound - 1e-6 <= end <= sum(durations) + 1e-6


def test_the_queue_head_is_not_overtaken() -> None:
    # 4 cores: a 3-core job of 10 s runs; the 2-core job next waits for it even though a
    # 1-core job behind it would fit now
    end = scale.ideal_makespan([10.0, 5.0, 1.0], [3, 2, 1], 4, [0, 1, 2])
    assert end == 15.0
    assert scale.ideal_makespan([10.0, 5.0, 1.0], [3, 2, 1], 4, [0, 2, 1]) == 15.0
    assert scale.ideal_makespan([1.0], [5], 4, [0]) == math.inf


def test_longest_first_beats_submission_order_on_a_deep_queue() -> None:
    # the 1 000-node point: 200 x 64 ranks of 600-1 200 s on 8 000 cores
    _, sims = scale.workload(scale.Config(nodes=1000, sims=200, ranks="64"))
    ref = scale.ideal_references(sims, 8000, 7.0)
    bound = max(sum(j.work_cpu_s for j in sims) / 8000, max(j.alone_s for j in sims) + 7.0)
    assert ref["lpt"] < ref["fifo"]
    assert ref["fifo"] / bound > 1.3  # no order-keeping schedule of rigid ranks meets 1.3x
