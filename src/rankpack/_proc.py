"""Process helpers shared by layers that must know whether a recorded owner still exists."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """True if a process with this pid exists (possibly owned by another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
