"""What a verdict needs and how it is decided: the five verdict words, the
Criteria built once from a profile (tolerance, alpha and the interval's
confidence, split over the planned looks), and the rule that turns a look's
centre, interval and adjusted p into an outcome.  Like golang/perf's
benchmath Thresholds, one object carries every threshold.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from mmlab.workloads import CALLS, STAY


class Verdict(StrEnum):
    """The five answers a comparison can give; each is its own display text."""
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    NO_CHANGE = "no change"
    UNRELIABLE = "unreliable"
    NOT_COMPARABLE = "not comparable"

    @property
    def changed(self) -> bool:
        return self in (Verdict.REGRESSION, Verdict.IMPROVEMENT)

    @property
    def decisive(self) -> bool:
        return self in (Verdict.REGRESSION, Verdict.IMPROVEMENT, Verdict.NO_CHANGE)


CORRECTIONS = ("holm", "none")



@dataclass(frozen=True)
class Criteria:
    """What a verdict needs, built once from the profile.

    `alpha` bounds the false alarms (a regression or improvement claimed where
    there is none) over the whole family of tests of a profile and over all
    looks; `confidence` is the level of the interval, which is also the
    "no change" test (two one-sided tests at (1 - confidence) / 2 each,
    Schuirmann 1987).  `margin` is the level of the mirror test for a change:
    that it exceeds the tolerance, one-sided against the band's edge, so a
    change inside the tolerance is rarely called one (docs/verdicts.md
    derives 0.20).  `max_cv` marks a comparison noisy: the simulated false
    alarms over the defaults' family stay under 2 % up to that noise per
    trial (alpha bounds them at any noise).  Both budgets are split over the planned looks in the
    manner of Haybittle (1971) and Peto et al. (1976): every interim look
    spends a small fixed share, the last look the rest; a Bonferroni split, so
    it holds whatever the correlation between looks.  The alarm's interim
    share is the larger, because an exact rank test of n rounds cannot go
    below p = 2 / 2^n: at 12 rounds and a family of 6, alpha / 10 / 6 is
    reachable, alpha / 50 / 6 is not.  The interval's is small because its
    hardest case (a CV of 5 % against a 5 % tolerance) is decided at the last
    look, which needs nearly the whole (1 - confidence).
    """
    tolerance: float = 0.05
    max_cv: float = 0.09          # the noise up to which the false-alarm figure holds
    alpha: float = 0.05
    confidence: float = 0.90
    min_rounds: int = 12
    max_rounds: int = 25
    correction: str = "holm"
    interim_alpha: float = 0.10       # share of alpha each interim look spends
    interim_confidence: float = 0.02  # share of (1 - confidence) each interim look spends
    margin: float = 0.20          # level of the test that a change exceeds the tolerance
    growth: float = 1.5           # each look has about this many times the rounds of the last
    outlier_z: float = 3.5

    def __post_init__(self) -> None:
        if self.correction not in CORRECTIONS:
            raise ValueError(f"correction {self.correction!r}: expected one of {CORRECTIONS}")
        if self.max_rounds < self.min_rounds:
            object.__setattr__(self, "max_rounds", self.min_rounds)

    @classmethod
    def of(cls, profile) -> Criteria:
        """From a Profile (experiment.profile.Profile; duck-typed to keep criteria free of it)."""
        return cls(tolerance=profile.tolerance, max_cv=profile.max_cv, alpha=profile.alpha,
                   confidence=profile.confidence, min_rounds=profile.repetitions,
                   max_rounds=profile.max_repetitions or profile.repetitions,
                   correction=profile.correction)

    def looks(self) -> tuple[int, ...]:
        """Rounds at each planned look: min, x growth, ..., max."""
        out = [self.min_rounds]
        while out[-1] < self.max_rounds:
            out.append(min(self.max_rounds, max(out[-1] + 1, round(out[-1] * self.growth))))
        return tuple(out)

    def share(self, look: int, interim: float) -> float:
        """The part of a budget look `look` (0-based) spends when every interim
        look spends `interim` of it."""
        k = len(self.looks())
        return interim if look < k - 1 else 1 - (k - 1) * interim

    def alpha_at(self, look: int) -> float:
        """The false-alarm level of look `look` (before the family's correction)."""
        return self.alpha * self.share(look, self.interim_alpha)

    def confidence_at(self, look: int) -> float:
        """The interval's level at look `look`."""
        return 1 - (1 - self.confidence) * self.share(look, self.interim_confidence)

    def margin_at(self, look: int) -> float:
        """The level of the two-sided interval whose ends are the one-sided
        bounds of look `look`'s margin test: 1 - 2 x its share of `margin`."""
        return 1 - 2 * self.margin * self.share(look, self.interim_alpha)

    def next_look(self, rounds: int) -> int | None:
        """The rounds of the first planned look beyond `rounds`; None past the last."""
        return next((n for n in self.looks() if n > rounds), None)

    def describe(self) -> str:
        looks = self.looks()
        if len(looks) == 1:
            return f"{looks[0]} rounds, one look"
        last = len(looks) - 1
        return (f"looks at {', '.join(map(str, looks))} rounds; alpha {self.alpha_at(0):.3g} and "
                f"{self.confidence_at(0):.1%} CIs at the interim looks, alpha "
                f"{self.alpha_at(last):.3g} and {self.confidence_at(last):.1%} at the last")


# Outcomes of one look, before the metric's direction names them.
UNDECIDED, NO_CHANGE, HIGHER, LOWER = 0, 1, 2, 3



def outcomes(low, high, margin_low, margin_high, p_adjusted, alpha: float,
             tolerance: float) -> np.ndarray:
    """The rule on log ratios, elementwise:
    NO_CHANGE  the whole interval lies inside [log(1-tol), log(1+tol)];
    HIGHER / LOWER  the adjusted p is below this look's alpha, the interval
               excludes 0, and the margin test's one-sided bound lies beyond
               the tolerance (the change exceeds it, not only its centre);
    UNDECIDED  otherwise."""
    up, down = math.log1p(tolerance), math.log1p(-tolerance)
    low, high, margin_low, margin_high = (np.asarray(x, dtype=float)
                                          for x in (low, high, margin_low, margin_high))
    with np.errstate(invalid="ignore"):
        inside = (low >= down) & (high <= up)
        sig = (np.asarray(p_adjusted, dtype=float) < alpha) & ((low > 0) | (high < 0))
        return np.where(inside, NO_CHANGE, np.where(sig & (margin_low > up), HIGHER,
                                                    np.where(sig & (margin_high < down), LOWER,
                                                             UNDECIDED)))


# ---------------------------------------------------------------- counts

# A count's floor by what it counts: a whole window (a command, a timed
# call) is mostly page clearing and faulting, where one path's step is
# diluted, so its floor stays the tracker's 1 %; one syscall's, fault's or
# function's path is narrower and measured tighter, so a step of a few
# tenths of a percent in it is news; calls per window are whole numbers,
# but interrupts among them follow the host's clock (docs/verdicts.md).
COUNT_FLOORS = {"window": 0.01, "path": 0.0025, "calls": 0.01}
COUNT_NOISES = 3.0      # a count step must exceed this many robust CVs (selftest changepoints)
STAY_FIGURE = re.compile(rf".+_({STAY.pattern})_({CALLS}|kernel_[a-z0-9_]+_per_[a-z0-9_]+)")


def count_family(metric: str) -> str:
    """Which floor a counted metric has, by its name: a stay's calls, a
    stay's (or any narrower path's) instructions, or a whole window's."""
    m = STAY_FIGURE.fullmatch(metric)
    if m is None:
        return "window"
    return "calls" if m[2] == "calls" else "path"


def count_outcomes(step, noise, low, high, floor: float,
                   noises: float = COUNT_NOISES) -> np.ndarray:
    """The count rule on log figures, elementwise (stats.separation gives
    them): a count is deterministic up to a small measured noise, so no
    p-value is asked (a rank test of few rounds cannot reach alpha, and at
    zero spread a t-test flags any step).  LKP's range separation with a
    noise margin:
    HIGHER / LOWER  the two sets do not overlap (`low` > 0 or `high` < 0:
               the smallest and largest log ratio of any trial to any) and
               the step of the medians exceeds both `noises` robust CVs of
               the noisier arm and the metric's `floor`;
    NO_CHANGE  every trial lies within the floor of every other's;
    UNDECIDED  otherwise (a step within the noise, or overlapping sets
               with a spread beyond the floor)."""
    step, noise, low, high = (np.asarray(x, dtype=float) for x in (step, noise, low, high))
    margin = np.maximum(math.log1p(floor), noises * noise)
    with np.errstate(invalid="ignore"):
        inside = (low >= math.log1p(-floor)) & (high <= math.log1p(floor))
        return np.where((low > 0) & (step > margin), HIGHER,
                        np.where((high < 0) & (step < -margin), LOWER,
                                 np.where(inside, NO_CHANGE, UNDECIDED)))


def verdict_of(outcome: int, higher_is_better: bool) -> Verdict:
    if outcome == NO_CHANGE:
        return Verdict.NO_CHANGE
    if outcome in (HIGHER, LOWER):
        return Verdict.IMPROVEMENT if (outcome == HIGHER) == higher_is_better \
            else Verdict.REGRESSION
    return Verdict.UNRELIABLE
