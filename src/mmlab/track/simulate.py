"""The tracker's operating characteristics, by simulation with its own
functions: each cell is paired rounds against the reference judged by the
paired estimator the runner uses, candidates come from `changepoints.
candidates`, and a candidate is confirmed by a simulated re-measurement of
the two neighbouring releases judged by `stats.estimate`, `of_estimate` and
`outcome_of`, as the tracker judges a real one.

Noise is lognormal per trial; a cell has CELL_ROUNDS rounds; a
confirmation has CONFIRM_ROUNDS.  A series is `releases` long with steps at
given releases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mmlab.judge import stats
from mmlab.judge.comparison import of_estimate
from mmlab.judge.criteria import Criteria
from mmlab.store.series import Series
from mmlab.track import changepoints
from mmlab.track.cells import CELL_ROUNDS
from mmlab.track.changepoints import Thresholds
from mmlab.track.session import CONFIRM_ROUNDS

LEVEL = 0.90


@dataclass(frozen=True)
class Case:
    name: str
    metric: str           # a count metric or a time metric, by name
    cv: float             # trial-to-trial noise
    steps: tuple[tuple[int, float], ...]   # (release index, ratio), cumulative


@dataclass(frozen=True)
class Rates:
    case: Case
    series: int
    any_candidate: float      # series with at least one candidate where there is no step
    false_confirmed: float    # series with a confirmed change where there is no step
    found_all: float          # series where every true step was confirmed, at its release


CASES = (
    Case("A/A, times, 5% noise", "x_ns_per_page", 0.05, ()),
    Case("A/A, counts, 0.3% noise", "x_kernel_insns_per_page", 0.003, ()),
    Case("10% step in time, 5% noise", "x_ns_per_page", 0.05, ((10, 1.10),)),
    Case("2% step in counts, 0.3% noise", "x_kernel_insns_per_page", 0.003, ((10, 1.02),)),
    Case("two steps in time (+10% at 6, -10% at 14)", "x_ns_per_page", 0.05,
         ((6, 1.10), (14, 1 / 1.10))),
)


def _truth(case: Case, releases: int) -> np.ndarray:
    """The true log ratio to the reference at every release."""
    level = np.zeros(releases)
    for at, ratio in case.steps:
        level[at:] += math.log(ratio)
    return level


def _sd(cv: float) -> float:
    return math.sqrt(math.log1p(cv * cv))


def simulate(case: Case, series: int = 1000, releases: int = 20, seed: int = 1,
             t: Thresholds = Thresholds()) -> Rates:
    rng = np.random.default_rng(seed)
    truth = _truth(case, releases)
    crit = Criteria(min_rounds=CONFIRM_ROUNDS, max_rounds=CONFIRM_ROUNDS)
    steps = {at for at, _ in case.steps}
    anyc = falsec = found = 0
    for _ in range(series):
        d = truth[:, None] + rng.normal(0, math.sqrt(2) * _sd(case.cv), (releases, CELL_ROUNDS))
        cell = stats.paired(d, LEVEL)
        ratios = np.exp(cell.centre)
        cis = list(zip(np.exp(cell.low), np.exp(cell.high)))
        noise = changepoints.sigma(cis, t.min_sigma)
        cands = changepoints.candidates(list(np.log(ratios)), noise, t)
        confirmed = set()
        for i in cands:
            confirmed |= {next((j for j in changepoints.located(i, releases)
                                if _confirm(case, truth[j] - truth[j - 1], crit, rng, t)), None)}
        confirmed.discard(None)
        if not steps:
            anyc += bool(cands)
            falsec += bool(confirmed)
        else:
            found += steps <= confirmed
    n = float(series)
    return Rates(case, series, anyc / n, falsec / n, found / n)


def _confirm(case: Case, log_step: float, crit: Criteria, rng: np.random.Generator,
             t: Thresholds) -> bool:
    """One re-measurement of the pair, judged as the tracker judges it."""
    sd = _sd(case.cv)
    base = np.exp(rng.normal(0, sd, CONFIRM_ROUNDS))
    arm = np.exp(log_step + rng.normal(0, sd, CONFIRM_ROUNDS))
    rounds = tuple(range(CONFIRM_ROUNDS))
    a = Series(tuple(arm), rounds, tuple(2 * r for r in rounds))
    b = Series(tuple(base), rounds, tuple(2 * r + 1 for r in rounds))
    e = stats.estimate("after", "before", a, b, crit, 0)
    c = of_estimate(case.metric, "after", "before", e, e.p_value, False, crit, 0,
                    CONFIRM_ROUNDS, "")
    return changepoints.outcome_of(case.metric, c, t) in ("regression", "improvement")


@dataclass(frozen=True)
class Targets:
    """The published targets at the defaults."""
    any_candidate: float = 0.05
    false_confirmed: float = 0.01
    time_step: float = 0.90
    count_step: float = 0.99

    def missed(self, rates: list[Rates]) -> list[str]:
        out = []
        for r in rates:
            if not r.case.steps:
                if r.any_candidate > self.any_candidate:
                    out.append(f"{r.case.name}: candidates in {r.any_candidate:.1%} of series")
                if r.false_confirmed > self.false_confirmed:
                    out.append(f"{r.case.name}: false changes in {r.false_confirmed:.1%}")
            elif len(r.case.steps) == 1:
                want = self.count_step if changepoints.is_count(r.case.metric) else self.time_step
                if r.found_all < want:
                    out.append(f"{r.case.name}: found in {r.found_all:.1%} < {want:.0%}")
        return out


def run(series: int = 1000, seed: int = 1) -> list[Rates]:
    return [simulate(c, series, seed=seed + i) for i, c in enumerate(CASES)]
