"""Moved: `Submission` (and `Phase`) live in `rankpack.plan.submission`, with the one
validation that `run`, `submit` and the operator use. Re-exported here for the importers
not updated yet."""

from rankpack.plan.submission import Phase, Submission

__all__ = ["Phase", "Submission"]
