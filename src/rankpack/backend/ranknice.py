"""Per-rank CPU weights inside one rank group: nice values.

A rank group is the ranks of one simulation on one node in one cgroup (the local backend's
run cgroup). The cgroup weighs the sum of its ranks' requests against everything else on
the node, exactly as the kubelet maps a pod's requests; inside it, the kernel weighs its
tasks by their nice values (``sched_prio_to_weight``: nice 0 weighs 1024, each step about
1.25x less). So a rank's share of its group follows its request when its nice value is the
one whose weight is nearest, in ratio, to ``1024 * request / largest request``.

Why not a cgroup per rank: on this kernel (EEVDF, 6.6+) ``sched_yield`` reorders only the
yielding task's own group, so a rank waiting in MPI alone in its cgroup cannot hand its
core to a peer in another; the measurements are in docs/decisions/0012-rank-groups.md.

Called by the local backend (the launcher's first nice, resizes) and the Kubernetes
backend's rank groups (`kubernetes.objects.groups.group_nices`).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Sequence
from pathlib import Path

NICE_WEIGHTS = (1024, 820, 655, 526, 423, 335, 272, 215, 172, 137,
                110, 87, 70, 56, 45, 36, 29, 23, 18, 15)  # fmt: skip
"""The kernel's weight of nice 0..19 (kernel/sched/core.c, ``sched_prio_to_weight``)."""
MAX_NICE = len(NICE_WEIGHTS) - 1


def nice_for(request_millis: int, largest_millis: int) -> int:
    """The nice value (0..19) whose weight relative to nice 0 is nearest, in ratio, to
    ``request_millis / largest_millis``; 0 for the largest request (or no requests)."""
    if largest_millis <= 0 or request_millis >= largest_millis:
        return 0
    target = math.log(max(request_millis, 1) / largest_millis * NICE_WEIGHTS[0])
    return min(range(MAX_NICE + 1), key=lambda n: abs(math.log(NICE_WEIGHTS[n]) - target))


def nices(requests_millis: Sequence[int]) -> list[int]:
    """Each rank's nice value in a group with these requests (the largest gets 0)."""
    largest = max(requests_millis, default=0)
    return [nice_for(r, largest) for r in requests_millis]


def set_nice(pid: int, nice: int) -> None:
    """Give every thread of ``pid`` this nice value (nice is per thread on Linux; threads
    started later inherit it from the thread that starts them). ProcessLookupError if the
    process is gone; OSError if the kernel refuses (lowering nice needs CAP_SYS_NICE)."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        tids = [int(t) for t in os.listdir(tasks)]
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    os.setpriority(os.PRIO_PROCESS, pid, nice)
    for tid in tids:
        if tid != pid:
            with contextlib.suppress(ProcessLookupError):  # a thread that just ended
                os.setpriority(os.PRIO_PROCESS, tid, nice)


def nice_of(pid: int) -> int:
    """The nice value of ``pid``'s main thread (ProcessLookupError if it is gone)."""
    try:
        return os.getpriority(os.PRIO_PROCESS, pid)
    except OSError as exc:
        raise ProcessLookupError(pid) from exc
