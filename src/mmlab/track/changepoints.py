"""Change points over a release-ordered series, in two stages, as Chromium's
Pinpoint does for commits:

1. *Candidates* from ruptures' PELT (Killick, Fearnhead and Eckley 2012):
   the exact least-squares segmentation of the series of log ratios to the
   reference, each new segment paying the Schwarz (BIC) penalty.  Each
   release is weighted by its own cell's interval (weighted least squares,
   as asv weights points by their CIs), never above a typical cell's
   weight, so a cell that outlying rounds made wide counts for less and
   none counts for more than the rest; in those units a change point adds
   two parameters (where, and the new level), so BIC charges 2 log(n).
   At 2 log(n), 3.9 % of 20-release A/A series (5 % noise) show a
   candidate, close to issue 20's 5 %; the penalty is the smallest multiple
   of 0.25 log(n) that keeps them near half of it (2.25: 2.5-2.7 %), which loses
   no 10 % step in mid-series and some at the newest release (simulate.py).
   ruptures is maintained, its numpy and scipy are unpinned, PELT is exact
   for any additive segment cost, and it takes this cost as a custom one
   (`WeightedL2`).  It has no significance test: that is the second stage.
2. *Confirmation*: a candidate between releases A and B becomes a change
   only when exactly that pair is measured again, B against A, interleaved,
   with adaptive looks (`confirm(A, B)`), and mmlab's own verdict says so.
   Instruction counts (CVs under 0.3 %) are judged by the count rule,
   in the tracker as in `compare` (criteria.count_outcomes): the two sets
   apart, and the step beyond both a few robust CVs of their own noise and
   a floor per kind of count (a whole command's 1 %, a syscall's path's
   0.25 %): a t-test gives p = 0 for any step at zero variance, and a rank
   test of few rounds cannot reach alpha, so no p-value is asked for.  Times need the
   verdict's significance and its tolerance, and then Benjamini-Hochberg
   over every time comparison the run's confirmations made (`family`), so
   the share of false changes is bounded over all profiles, metrics and
   releases at once.
A pair the audit finds in different page states is a *state change*, never
a regression.  A time step measured in a TCG guest is never one on its own
either: emulated time can point the other way from hardware time, while
instruction counts are exact there, so the pair's counts decide
(`emulated_outcome`).  simulate.py measures what this achieves.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import ruptures
from ruptures.base import BaseCost
from scipy.stats import false_discovery_control

from mmlab.judge.comparison import Comparison, not_comparable
from mmlab.judge.criteria import COUNT_FLOORS, Criteria, Verdict, count_family
from mmlab.track.releases import Release
from mmlab.workloads import insns, is_count
from mmlab.workloads.samples import Sample

Z90 = 1.6449          # a 90 % interval's half-width in sigmas
CONFIRMED = ("regression", "improvement")
EMULATED_ONLY = "emulated time only"              # the pair's counts did not change
NOT_COUNTED = "emulated time, not counted"        # the pair has no counts to say
COUNTS_CHANGED = "emulated time, counts changed"  # the counts' own change is the finding
EMULATED = (EMULATED_ONLY, NOT_COUNTED, COUNTS_CHANGED)
BUILDS = "counted by different plugin builds"
ACROSS_BUILDS = f"not comparable ({BUILDS})"      # a count pair no one build counted


@dataclass(frozen=True)
class Thresholds:
    """What makes a candidate and a change, in one object."""
    penalty: float = 2.25          # x log(n) per change point, in weighted units (BIC: 2)
    min_sigma: float = 0.004       # noise floor on the log scale (times)
    count_sigma: float = 0.4       # a count's noise floor: this share of its floor (counts
    #                                are near 0; a syscall's 0.25 % step must stand out)
    count_widen: float = 1.18      # a count cell's interval widened: t(0.95, 6) / z(0.95)

    def sigma_floor(self, metric: str) -> float:
        """The noise floor of `metric`'s series on the log scale."""
        if not is_count(metric):
            return self.min_sigma
        return self.count_sigma * COUNT_FLOORS[count_family(metric)]
    alpha: float = 0.05            # Benjamini-Hochberg over the run's time comparisons


def sigmas(ci_pairs: list[tuple[float, float]], floor: float,
           widen: float = 1.0) -> np.ndarray:
    """Each release's noise on the log scale, from its cell's 90 % interval
    times `widen`, never below the series' median (so no cell weighs more
    than a typical one; the reference, exact by definition, weighs as much)
    nor `floor`.  A count cell's 4 trials a side are compared unpaired, by
    the medians' percentile bootstrap, which at that size is narrower than
    the noise: its spread rests on 6 degrees of freedom, so it is widened
    by Student's t(0.95, 6) over z(0.95), 1.18 (a syscall's counts at 2 %
    noise: candidates in 5.9 % of A/A series, 1.6 % widened; simulate.py)."""
    lo, hi = (np.array(x, dtype=float) for x in zip(*ci_pairs))
    with np.errstate(divide="ignore", invalid="ignore"):
        s = widen * (np.log(hi) - np.log(lo)) / (2 * Z90)
    s = np.where(np.isfinite(s), s, np.nan)
    typical = max(float(np.nanmedian(s[s > 0])) if (s > 0).any() else floor, floor)
    return np.where(np.isfinite(s), np.maximum(s, typical), typical)


class WeightedL2(BaseCost):
    """ruptures' cost for a segment: the weighted sum of squared deviations
    from its weighted mean, the signal's columns being (value, weight)."""
    model = "weighted-l2"
    min_size = 1

    def fit(self, signal: np.ndarray) -> WeightedL2:
        self.signal = signal
        x, w = signal[:, 0], signal[:, 1]
        self.sums = [np.concatenate([[0.0], np.cumsum(v)]) for v in (w, w * x, w * x * x)]
        return self

    def error(self, start: int, end: int) -> float:
        w, wx, wxx = (c[end] - c[start] for c in self.sums)
        return float(wxx - wx * wx / w)


def candidates(log_ratios: list[float], noise: np.ndarray,
               t: Thresholds = Thresholds()) -> list[int]:
    """Indices i where a step starts, between release i-1 and i, given each
    release's noise (`sigmas`)."""
    n = len(log_ratios)
    if n < 2:
        return []
    x = np.column_stack([np.asarray(log_ratios, dtype=float), 1 / np.square(noise)])
    ends = ruptures.Pelt(custom_cost=WeightedL2(), min_size=1, jump=1).fit(x).predict(
        pen=t.penalty * math.log(n))
    return [b for b in ends if b < n]


def change_id(*parts: str) -> str:
    """A change's stable identity: the same suite, profile, metric, series
    and release pair always get the same ID."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:10]


@dataclass(frozen=True)
class Change:
    id: str
    profile: str
    metric: str
    kind: str                      # the series: across, or a branch (6.12.y)
    before: str                    # release labels, as the series names them
    after: str
    candidate_ratio: float         # after / before, from the series' cells
    confirmation: Comparison | None
    outcome: str                   # regression, improvement, emulated time only, emulated
    #                                time (not counted), state change, same, unknown, candidate
    #                                (not confirmed: not measured yet, or an emulated time step
    #                                nobody asked to confirm)
    evidence: int | None = None    # the confirmation that decided it: its experiment
    releases: tuple[Release, Release] | None = None   # what its confirmation measured, else
    #                                                   its cells (a candidate's)
    also: int | None = None        # the pair's confirmation of the other class of metric
    emulated: bool = False         # its figures are emulated time (a TCG guest's clock)

    @property
    def confirmed(self) -> bool:
        return self.outcome in CONFIRMED

    @property
    def step(self) -> float:
        """Its after / before ratio as every report states it: its
        confirmation's (`stated_ratio`), the two releases measured side by
        side, where it has one; else the series' cells'."""
        c = self.confirmation
        r = stated_ratio(c) if c is not None else math.nan
        return r if math.isfinite(r) and r > 0 else self.candidate_ratio

    @property
    def decided(self) -> bool:
        """A confirmation of its own metric made it: a confirmed change, or
        an emulated time change whose time was confirmed too (not one its
        counts alone decided)."""
        return self.confirmed or (self.outcome in EMULATED and self.confirmation is not None)


def stated_ratio(c: Comparison) -> float:
    """The after / before ratio the tracker states and segments: a count's
    is its medians' step, the one the count rule decides on; the
    estimator's ratio, which the judge keeps for every metric, is pulled by
    one trial where a timer tick or a cold cache landed inside a short call
    (readlink's per call: +18.2% where 10 of its 12 trials said +6.0%).
    A time's is the estimator's."""
    if is_count(c.metric) and c.median_baseline > 0 and math.isfinite(c.median):
        return c.median / c.median_baseline
    return c.ratio


def outcome_of(metric: str, c: Comparison | None, t: Thresholds = Thresholds()) -> str:
    """What a confirmation says: Pinpoint's same / different / unknown, with
    the direction, and a page-state difference kept apart; "candidate"
    while the pair has not been measured.  "same" only where the verdict
    is no change: an unreliable count (its sets overlap beyond its floor)
    is "unknown", as a time's is."""
    if c is None:
        return "candidate"
    if c.verdict == Verdict.NOT_COMPARABLE:
        return ACROSS_BUILDS if across_builds(c) else "state change"
    if is_count(metric) and not c.method:
        return "unknown"                     # no estimate: too few trials
    if c.verdict.changed:
        return str(c.verdict)
    return "same" if c.verdict == Verdict.NO_CHANGE else "unknown"


def plugin_builds(samples: list[Sample]) -> set[str]:
    """The builds of mmlab's TCG plugin that counted `samples` (the state
    each records; "" for one counted before samples recorded it: its
    inclusive counts still held the interrupts that landed in them)."""
    return {str(s.state.get(insns.PLUGIN_KEY, "")) for s in samples
            if str(s.state.get(insns.SOURCE_KEY, "")).startswith("qemu tcg plugin")}


def by_one_build(comparisons: list[Comparison],
                 by_arm: dict[str, list[Sample]]) -> list[Comparison]:
    """`comparisons`, each count whose two arms were counted by more than
    one build of the plugin made not comparable: a change to the plugin
    (what it counts, or how: an interrupt taken out of the functions it
    landed in) moves the counts as much as a kernel's, so only counts of
    one build say how two kernels differ.  One build on both sides is
    judged as before, whichever it is."""
    out = []
    for c in comparisons:
        builds = plugin_builds([*by_arm.get(c.arm, []), *by_arm.get(c.baseline, [])])
        if is_count(c.metric) and len(builds) > 1:
            named = ", ".join(b or "one that recorded none" for b in sorted(builds))
            c = not_comparable(c, f"{BUILDS} ({named}): {c.reason}")
        out.append(c)
    return out


def across_builds(c: Comparison) -> bool:
    """`c` is not comparable because its two sides were counted by
    different builds of the plugin (by_one_build)."""
    return c.verdict == Verdict.NOT_COMPARABLE and c.reason.startswith(BUILDS)


def why(metric: str, c: Comparison, outcome: str) -> str:
    """In a few words, why the tracker's outcome of a confirmation differs
    from the verdict beside it ("" where the two agree): an emulated time
    step is decided by the pair's counts."""
    if outcome == EMULATED_ONLY:
        return "it is emulated time, and the pair's instruction counts did not change"
    if outcome == NOT_COUNTED:
        return "it is emulated time, and nothing counted the pair"
    if outcome == COUNTS_CHANGED:
        return ("it is emulated time; the pair's instruction counts changed, and that change "
                "is reported on its own")
    if outcome == ACROSS_BUILDS:
        return ("its two sides were counted by different builds of mmlab's plugin, whose "
                "counts differ by the plugin's change as well as the kernels'")
    return ""


def counted(outcomes: list[str]) -> str | None:
    """What a release pair's instruction counts say (their confirmation's
    outcomes, one per count metric): "changed" where one changed, "same"
    where every one stayed, None where they cannot say (nothing counted,
    unknown, a state change)."""
    if any(o in CONFIRMED for o in outcomes):
        return "changed"
    return "same" if outcomes and all(o == "same" for o in outcomes) else None


def direction(outcomes: list[str]) -> str | None:
    """The one direction the changed counts of a pair agree on, if they do:
    what an emulated time step of a profile that counts nothing of its own
    is, when its pair's counts changed."""
    found = {o for o in outcomes if o in CONFIRMED}
    return found.pop() if len(found) == 1 else None


def emulated_outcome(time: str, counts: str | None) -> str:
    """An emulated time step's outcome, from its time confirmation's
    (outcome_of; "candidate" where that was not measured) and what the
    pair's counts say (`counted`).  A counted change backs the time
    verdict; counts that stayed make a time change, confirmed or not,
    "emulated time only"; with no counts to say, a confirmed time change is
    "emulated time, not counted".  Where the counts changed, the time step
    keeps its confirmed verdict (only confirmed when asked for) or is
    "emulated time, counts changed": the counted change is the finding.
    Emulated time alone is never a regression or an improvement."""
    if counts == "changed":
        return time if time in CONFIRMED else COUNTS_CHANGED
    if counts == "same" and time in (*CONFIRMED, "candidate"):
        return EMULATED_ONLY
    return NOT_COUNTED if time in CONFIRMED else time


# (before, after) labels -> the pair's comparison of the series' metric (None where the
# pair is not measured for it) and the tracker's outcome of it (outcome_of, or
# emulated_outcome for an emulated time step)
Confirm = Callable[[str, str], "tuple[Comparison | None, str]"]


def find(ident: tuple[str, str, str, str], labels: list[str], ratios: list[float],
         cis: list[tuple[float, float]], confirm: Confirm,
         t: Thresholds = Thresholds()) -> list[Change]:
    """The candidates of one series (`ident`: suite, profile, metric, kind),
    each decided by `confirm(before, after)`: the pair's comparison (None
    when it is not measured: a report that only reads) and its outcome."""
    suite, profile, metric, kind = ident
    out: dict[str, Change] = {}
    noise = sigmas(cis, t.sigma_floor(metric), t.count_widen if is_count(metric) else 1.0)
    for i in candidates([math.log(r) for r in ratios], noise, t):
        tried = []
        for j in located(i, len(labels)):
            c, outcome = confirm(labels[j - 1], labels[j])
            tried.append(Change(change_id(suite, profile, metric, kind, labels[j - 1], labels[j]),
                                profile, metric, kind, labels[j - 1], labels[j],
                                ratios[j] / ratios[j - 1], c, outcome))
            if tried[-1].outcome != "same":
                break
        change = tried[-1] if tried[-1].outcome != "same" else tried[0]
        out.setdefault(change.id, change)          # two candidates, one release pair
    return list(out.values())


def located(i: int, n: int) -> list[int]:
    """The release pairs a candidate at i is confirmed on, in turn: its own,
    then its neighbours, since a noisy series can place a step one release
    off (each is measured only while the previous one says "same")."""
    return [j for j in (i, i + 1, i - 1) if 1 <= j < n]


def sequential_p(c: Comparison) -> float:
    """The smallest alpha at which the confirmation's sequential test would
    have rejected: its p at the look that decided, divided by the share of
    alpha that look spends (the looks split alpha Bonferroni-wise,
    criteria.Criteria), so a correction over many confirmations keeps the
    looks' own control."""
    crit = Criteria()
    k = max(c.looks, 1)
    share = crit.interim_alpha if c.look < k else 1 - (k - 1) * crit.interim_alpha
    return min(1.0, c.p_value / share) if math.isfinite(c.p_value) else math.nan


Test = tuple[int, str]          # (confirmation experiment, metric)


def family(changes: list[Change], tests: dict[Test, tuple[str, Comparison]],
           t: Thresholds = Thresholds()) -> list[Change]:
    """Benjamini-Hochberg (1995; scipy's false_discovery_control) over every
    time comparison of each run's confirmations, `tests` mapping
    (experiment, metric) to (run, comparison): a confirmed time change
    whose adjusted p is not below alpha becomes 'unknown'.  Not Holm: a
    confirmation decided at its first look (12 paired rounds) has an exact
    p of at least 2^-11, 0.0049 once the look's share of alpha is charged,
    and Holm over a run's ~40 time tests asks the smallest for 0.05/40, so
    it keeps none of them (on the seeds suite it demoted 25 of the 31 time
    changes the verdicts had decided, a -95% step among them, and kept
    only those decided at a later look).  BH bounds the share of
    false changes among those reported, which is what a tracker reports;
    where every test is null (an A/A series) that is the chance of any.
    A run's family is fixed once it ends, so a change keeps its verdict
    when later runs add releases.  An emulated time change whose time was
    confirmed is in the family too; one decided by its counts alone (no
    time comparison: `confirmation` None) and counts pass as they are."""
    adjusted: dict[Test, float] = {}
    for run in {r for r, _ in tests.values()}:
        ps = {k: sequential_p(c) for k, (r, c) in tests.items() if r == run
              and not is_count(k[1])}
        mine = {k: p for k, p in ps.items() if math.isfinite(p)}
        if mine:
            adjusted.update(zip(mine, false_discovery_control(list(mine.values()))))
    out = []
    for ch in changes:
        p = adjusted.get((ch.evidence, ch.metric), math.nan) if ch.evidence is not None else 1.0
        drop = ch.decided and ch.confirmation is not None and not is_count(ch.metric) \
            and not p < t.alpha
        out.append(replace(ch, outcome="unknown") if drop else ch)
    return out
