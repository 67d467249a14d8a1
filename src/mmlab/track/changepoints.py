"""Change points over a release-ordered series, in two stages, as Chromium's
Pinpoint does for commits:

1. *Candidates* from ruptures' PELT (Killick et al. 2012) on the series of
   log ratios to the reference, with the L2 cost and a penalty of
   `penalty` x sigma^2 x log(n) (a BIC-like penalty scaled by the series'
   own noise, read from the cells' intervals).  ruptures is maintained,
   has unpinned numpy and scipy, and PELT is exact for this cost; it has
   no significance test, which is the second stage's job.
2. *Confirmation*: a candidate between releases A and B becomes a change
   only when the pair is measured again, exactly A against B, interleaved,
   with adaptive looks, and mmlab's own verdict says so.  Instruction
   counts (CVs under 0.3 %) are confirmed by magnitude alone: the step must
   exceed `count_cvs` times the pair's robust CV, and its interval lie beyond
   `count_tolerance` (a t-test gives p = 0 for any step at zero variance).  Times need the
   verdict's significance and its tolerance, and then Holm over every
   time-metric change of the run, so false alarms are bounded over all
   profiles, metrics and releases at once.
A pair the audit finds in different page states is a *state change*, never
a regression.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import ruptures

from mmlab.judge import stats
from mmlab.judge.comparison import Comparison
from mmlab.judge.criteria import Verdict

Z90 = 1.6449          # a 90 % interval's half-width in sigmas


@dataclass(frozen=True)
class Thresholds:
    """What makes a candidate and a change, in one object."""
    penalty: float = 3.0           # x sigma^2 x log(n): PELT's penalty (simulate.py)
    min_sigma: float = 0.004       # noise floor on the log scale (counts are near 0)
    count_cvs: float = 3.0         # a count step must exceed this many robust CVs
    count_tolerance: float = 0.01  # and its interval must lie beyond this fraction
    alpha: float = 0.05            # Holm over the run's time-metric changes


def is_count(metric: str) -> bool:
    """Instruction counts are deterministic enough to need no p-value."""
    return "_insns_per_" in metric


def sigma(ci_pairs: list[tuple[float, float]], floor: float) -> float:
    """The series' noise on the log scale: the median half-width of the
    cells' intervals in sigmas, never below `floor`."""
    widths = [(math.log(hi) - math.log(lo)) / (2 * Z90) for lo, hi in ci_pairs
              if lo > 0 and hi > 0 and math.isfinite(lo) and math.isfinite(hi)]
    return max(float(np.median(widths)) if widths else floor, floor)


def candidates(log_ratios: list[float], noise: float, t: Thresholds = Thresholds()) -> list[int]:
    """Indices i where a step starts, between release i-1 and i."""
    x = np.asarray(log_ratios, dtype=float).reshape(-1, 1)
    n = len(x)
    if n < 2:
        return []
    pen = t.penalty * noise * noise * math.log(n)
    ends = ruptures.Pelt(model="l2", min_size=1, jump=1).fit(x).predict(pen=pen)
    return [b for b in ends if b < n]


def change_id(*parts: str) -> str:
    """A change's stable identity: the same suite, profile, metric and
    release pair always get the same ID."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:10]


@dataclass(frozen=True)
class Change:
    id: str
    profile: str
    metric: str
    before: str
    after: str
    candidate_ratio: float         # after / before, from the series
    confirmation: Comparison | None
    outcome: str                   # regression, improvement, state change, same, unknown

    @property
    def confirmed(self) -> bool:
        return self.outcome in ("regression", "improvement")


def outcome_of(metric: str, c: Comparison | None, t: Thresholds) -> str:
    """What a confirmation says: Pinpoint's same / different / unknown, with
    the direction, and a page-state difference kept apart; "candidate" while
    the pair has not been measured."""
    if c is None:
        return "candidate"
    if c.verdict == Verdict.NOT_COMPARABLE:
        return "state change"
    if is_count(metric):
        if not (math.isfinite(c.ci_low) and math.isfinite(c.ci_high)):
            return "unknown"
        floor = max(t.count_cvs * max(c.rcv, c.rcv_baseline), t.count_tolerance)
        beyond = c.ci_low > 1 + t.count_tolerance or c.ci_high < 1 - t.count_tolerance
        if not beyond or abs(c.ratio - 1) <= floor:
            return "same"
        return "regression" if c.ratio > 1 else "improvement"   # counts: lower is better
    if c.verdict.changed:
        return str(c.verdict)
    return "same" if c.verdict == Verdict.NO_CHANGE else "unknown"


def find(suite: str, profile: str, metric: str, kernels: list[str], ratios: list[float],
         cis: list[tuple[float, float]], confirm: Callable[[str, str], Comparison | None],
         t: Thresholds = Thresholds()) -> list[Change]:
    """The candidates of one series, each confirmed by `confirm(before, after)`."""
    noise = sigma(cis, t.min_sigma)
    out = []
    for i in candidates([math.log(r) for r in ratios], noise, t):
        change = None
        for j in located(i, len(kernels)):
            c = confirm(kernels[j - 1], kernels[j])
            change = Change(change_id(suite, profile, metric, kernels[j - 1], kernels[j]),
                            profile, metric, kernels[j - 1], kernels[j],
                            ratios[j] / ratios[j - 1], c, outcome_of(metric, c, t))
            if change.outcome != "same":
                break
        if change.id not in {c.id for c in out}:      # two candidates, one release pair
            out.append(change)
    return out


def located(i: int, n: int) -> list[int]:
    """The release pairs a candidate at i is confirmed on, in turn: its own,
    then its neighbours, since a noisy series can place a step one release
    off (each is measured only while the previous one says "same")."""
    return [j for j in (i, i + 1, i - 1) if 1 <= j < n]


def family(changes: list[Change], t: Thresholds = Thresholds()) -> list[Change]:
    """Holm over the run's confirmed time-metric changes: one that does not
    survive the family's correction is 'unknown'; counts pass as they are."""
    timed = [c for c in changes if c.confirmed and not is_count(c.metric)]
    if not timed:
        return changes
    adjusted = stats.holm(np.array([c.confirmation.p_value for c in timed]))
    dropped = {c.id for c, p in zip(timed, adjusted) if not p < t.alpha}
    return [Change(c.id, c.profile, c.metric, c.before, c.after, c.candidate_ratio,
                   c.confirmation, "unknown") if c.id in dropped else c for c in changes]
