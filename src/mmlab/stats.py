"""Summaries of samples and comparisons between arms.

Medians rather than means throughout: mm timings have long right tails
(reclaim, compaction and lock waits strike some samples and not others), and
the median with a bootstrap interval is robust to them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    mean: float
    stdev: float
    cv: float      # stdev / mean; 0.05 is 5 %
    mad: float     # median absolute deviation, unscaled
    min: float
    max: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def summarize(values: list[float]) -> Summary:
    """The per-arm statistics of one metric; NaN where undefined (n < 2)."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if x.size == 0:
        nan = float("nan")
        return Summary(0, nan, nan, nan, nan, nan, nan, nan)
    mean = float(x.mean())
    stdev = float(x.std(ddof=1)) if x.size > 1 else float("nan")
    med = float(np.median(x))
    return Summary(
        n=int(x.size), median=med, mean=mean, stdev=stdev,
        cv=stdev / abs(mean) if mean else float("nan"),
        mad=float(np.median(np.abs(x - med))),
        min=float(x.min()), max=float(x.max()))
