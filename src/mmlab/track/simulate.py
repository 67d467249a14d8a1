"""The tracker's operating characteristics, by simulation through its own
functions: each cell is paired rounds against the reference (CELL_ROUNDS
for a time, COUNT_CELL_ROUNDS for a count),
estimated by the paired estimator the runner uses (`stats.paired`); the
series goes through `changepoints.find` with a `confirm` that re-measures
the pair as a confirmation does (rounds drawn afresh, judged look by look
by `stats.estimate` and `of_estimate` with the confirmation's criteria,
stopping at the first decisive verdict as the adaptive runner does); and
the series' confirmations are one family (`changepoints.family`).

Noise is lognormal per trial, the same CV on every release, and in one
case with a heavy tail (a share of trials 30 % slower, as `selftest
verdicts`' MIX); a series is `releases` long, with steps (cumulative
ratios) at given releases.  A count's confirmation is judged by the count
rule (verdicts.by_count), at each kind of count's floor: a whole
command's (1 %) and a syscall's (0.25 %), with the spreads measured
(docs/tracker.md): 0.01-0.05 % for a whole command, up to 2 % for a short
syscall's calls, which timer ticks land in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats as sps

from mmlab.judge import stats, verdicts
from mmlab.judge.comparison import Comparison, of_estimate
from mmlab.judge.criteria import Criteria
from mmlab.judge.measurements import Observations
from mmlab.track import changepoints
from mmlab.track.cells import CELL_ROUNDS, COUNT_CELL_ROUNDS
from mmlab.track.changepoints import Thresholds
from mmlab.track.session import ROUNDS, metric_class

SYSCALL = "command_syscall_mprotect_kernel_insns_per_call"   # a path's count (its floor 0.25%)
CELL = {cls: Criteria(min_rounds=rounds, max_rounds=rounds)
        for cls, rounds in (("times", CELL_ROUNDS), ("counts", COUNT_CELL_ROUNDS))}
CONFIRMATION = {cls: Criteria(min_rounds=low, max_rounds=high, correction="none")
                for cls, (low, high) in ROUNDS.items()}


@dataclass(frozen=True)
class SeriesModel:
    """A release series to simulate: its metric's noise and where it steps."""
    name: str
    metric: str           # a count metric or a time metric, by name
    cv: float             # trial-to-trial noise
    steps: tuple[tuple[int, float], ...]   # (release index, ratio), cumulative
    goal: float | None = None              # the published share of series found, if any
    outliers: float = 0.0                  # share of trials 30 % slower (heavy tail)

    def noise(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """Each trial's own noise on the log scale."""
        return (rng.normal(0, _sd(self.cv), shape)
                + math.log(1.3) * (rng.random(shape) < self.outliers))


@dataclass(frozen=True)
class Rates:
    case: SeriesModel
    series: int
    any_candidate: float      # series with a candidate where there is no step
    candidates: float         # candidates per series
    false_confirmed: float    # series with a change confirmed where there is no step
    found_all: float          # series where every true step was confirmed, at its release
    confirmations: float      # pairs measured per series
    rounds: float             # rounds per confirmation


CASES = (
    SeriesModel("A/A, times, 5% noise", "x_ns_per_page", 0.05, ()),
    SeriesModel("A/A, counts, 0.3% noise", "x_kernel_insns_per_page", 0.003, ()),
    SeriesModel("A/A, a syscall's counts, 0.02% noise", SYSCALL, 0.0002, ()),
    SeriesModel("A/A, a syscall's counts, 2% noise (timer ticks)", SYSCALL, 0.02, ()),
    SeriesModel("A/A, times, 2% noise and 5% of trials +30%", "x_ns_per_page", 0.02, (),
         outliers=0.05),
    SeriesModel("10% step in time, 5% noise", "x_ns_per_page", 0.05, ((10, 1.10),), 0.90),
    SeriesModel("2% step in counts, 0.3% noise", "x_kernel_insns_per_page", 0.003, ((10, 1.02),),
         0.99),
    SeriesModel("0.4% step in a syscall's counts, 0.02% noise", SYSCALL, 0.0002, ((10, 1.004),),
                0.99),
    SeriesModel("0.4% step in a whole command's counts (its floor 1%)",
                "command_kernel_insns_per_run", 0.0002, ((10, 1.004),)),
    SeriesModel("two steps in time (+10% at 6, -10% at 14)", "x_ns_per_page", 0.05,
         ((6, 1.10), (14, 1 / 1.10))),
    SeriesModel("10% step in time in the newest release", "x_ns_per_page", 0.05, ((19, 1.10),)),
)


def _sd(cv: float) -> float:
    """The log-scale sd of a lognormal with coefficient of variation `cv`."""
    return math.sqrt(math.log1p(cv * cv))


def _truth(case: SeriesModel, releases: int) -> np.ndarray:
    """The true log ratio to the reference at every release."""
    level = np.zeros(releases)
    for at, ratio in case.steps:
        level[at:] += math.log(ratio)
    return level


def confirmation(case: SeriesModel, log_step: float, rng: np.random.Generator) -> Comparison:
    """One re-measured pair, judged look by look until decided, as the
    runner and verdicts.judge judge a confirmation of the case's class of
    metric (its rounds: session.ROUNDS)."""
    crit = CONFIRMATION[metric_class(case.metric)]
    n = crit.looks()[-1]
    before = np.exp(case.noise(rng, (n,)))
    after = np.exp(log_step + case.noise(rng, (n,)))
    metric = case.metric
    for look, rounds in enumerate(crit.looks()):
        r = tuple(range(rounds))
        a = Observations(tuple(after[:rounds]), r, tuple(2 * i for i in r))
        b = Observations(tuple(before[:rounds]), r, tuple(2 * i + 1 for i in r))
        e = stats.estimate("after", "before", a, b, crit, look)
        c = of_estimate(metric, "after", "before", e, e.p_value, False, crit, look, rounds, "")
        if changepoints.is_count(metric):
            c = verdicts.by_count(c, a.values, b.values, False)
        if c.verdict.decisive:
            break
    return c


def cells(after: np.ndarray, before: np.ndarray,
          crit: Criteria) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Each release's ratio and interval from its cell's log values (rows:
    releases, columns: rounds) as stats.estimate gives them: paired from
    MIN_PAIRS rounds, else (a count's cell of 4 rounds) the medians' ratio
    with the unpaired bootstrap's interval."""
    if after.shape[-1] >= stats.MIN_PAIRS:
        cell = stats.paired(after - before, crit.confidence_at(0), crit.margin_at(0))
        return np.exp(cell.centre), (np.exp(cell.low), np.exp(cell.high))
    x, y = np.exp(after), np.exp(before)
    (interval,) = stats.bootstrap_ratio(x, y, (crit.confidence_at(0),))
    return np.median(x, -1) / np.median(y, -1), interval


def one_series(case: SeriesModel, releases: int, rng: np.random.Generator,
               t: Thresholds = Thresholds()) -> tuple[list[changepoints.Change], int, float]:
    """(changes after the family's correction, confirmations, their mean rounds)."""
    truth = _truth(case, releases)
    crit = CELL[metric_class(case.metric)]
    shape = (releases, crit.min_rounds)
    after, before = truth[:, None] + case.noise(rng, shape), case.noise(rng, shape)
    centre, (low, high) = cells(after, before, crit)
    labels = [str(i) for i in range(releases)]
    tests: dict[changepoints.Test, tuple[str, Comparison]] = {}
    made: dict[tuple[str, str], int] = {}

    def confirm(before: str, after: str) -> tuple[Comparison, str]:
        j = int(after)
        c = confirmation(case, truth[j] - truth[j - 1], rng)
        made[(before, after)] = len(tests)
        tests[(len(tests), case.metric)] = ("run", c)
        return c, changepoints.outcome_of(case.metric, c, t)
    found = changepoints.find(("sim", "p", case.metric, "across"), labels, list(centre),
                              list(zip(low, high)), confirm, t)
    found = [replace(ch, evidence=made[(ch.before, ch.after)]) for ch in found]
    rounds = [c.rounds for _, c in tests.values()]
    return (changepoints.family(found, tests, t), len(tests),
            float(np.mean(rounds)) if rounds else 0.0)


def simulate(case: SeriesModel, series: int = 1000, releases: int = 20, seed: int = 1,
             t: Thresholds = Thresholds()) -> Rates:
    rng = np.random.default_rng(seed)
    steps = {at for at, _ in case.steps}
    anyc = ncand = falsec = found = nconf = 0
    rounds = []
    for _ in range(series):
        changes, n, mean_rounds = one_series(case, releases, rng, t)
        confirmed = {int(ch.after) for ch in changes if ch.confirmed}
        anyc += bool(changes)
        ncand += len(changes)
        falsec += bool(confirmed - steps)
        found += steps <= confirmed
        nconf += n
        rounds += [mean_rounds] * n
    k = float(series)
    return Rates(case, series, anyc / k if not steps else math.nan, ncand / k, falsec / k,
                 found / k if steps else math.nan, nconf / k,
                 float(np.mean(rounds)) if rounds else 0.0)


GOAL_LEVEL = 0.95      # one-sided: how sure a simulated rate must be to miss a goal


def rate_bounds(share: float, series: int, level: float = GOAL_LEVEL) -> tuple[float, float]:
    """The exact (Clopper-Pearson) one-sided bounds, each at `level`, of the
    rate seen as `share` of `series` simulated series.  A simulated rate is
    a sample: at 2,000 series a rate near 99 % varies by about 0.2 %, as
    much as a goal's margin, so the rate alone cannot say a goal is missed."""
    k = round(share * series)
    low = 0.0 if k == 0 else float(sps.beta.ppf(1 - level, k, series - k + 1))
    high = 1.0 if k == series else float(sps.beta.ppf(level, k + 1, series - k))
    return low, high


@dataclass(frozen=True)
class ChangePointGoals:
    """The published goals at the defaults: A/A series with a
    candidate and with a false change; each stepped case's own goal.  A
    goal is judged against the simulation's sampling error: missed only
    when even the rate's bound toward it (rate_bounds) is past it, so a
    run of few series does not call a method that meets its goals a miss;
    a rate past its goal by less than that is reported, neither met nor
    missed (more series decide it)."""
    any_candidate: float = 0.05
    false_confirmed: float = 0.01

    def missed(self, rates: list[Rates]) -> list[str]:
        """The goals the simulated series show missed beyond their sampling error."""
        return [say for sure, say in self._past(rates) if sure]

    def unsure(self, rates: list[Rates]) -> list[str]:
        """The goals a rate is past by no more than its sampling error."""
        return [say for sure, say in self._past(rates) if not sure]

    def summary(self, rates: list[Rates]) -> str:
        """One line: met, or what is missed, or what only more series can decide."""
        missed, unsure = self.missed(rates), self.unsure(rates)
        if missed:
            return "MISSED: " + "; ".join(missed)
        return "met" + (" (within sampling error, more series decide: " + "; ".join(unsure)
                        + ")" if unsure else "")

    def _past(self, rates: list[Rates]) -> list[tuple[bool, str]]:
        """(beyond sampling error, what) for every goal a rate is past."""
        out = []
        for r, what, share, goal, at_most in self._goals(rates):
            low, high = rate_bounds(share, r.series)
            if share > goal if at_most else share < goal:
                out.append((low > goal if at_most else high < goal,
                            f"{r.case.name}: {what} {share:.1%} {'>' if at_most else '<'} "
                            f"{goal:.0%} ({low:.1%}..{high:.1%} over {r.series} series)"))
        return out

    def _goals(self, rates: list[Rates]) -> list[tuple[Rates, str, float, float, bool]]:
        """(rates, what, share, goal, whether the goal is a most) of each goal."""
        out = []
        for r in rates:
            if not r.case.steps:
                out += [(r, "candidates in", r.any_candidate, self.any_candidate, True),
                        (r, "false changes in", r.false_confirmed, self.false_confirmed, True)]
            if r.case.goal is not None:
                out.append((r, "found in", r.found_all, r.case.goal, False))
        return out


def simulate_all(series: int = 1000, seed: int = 1,
                 t: Thresholds = Thresholds()) -> list[Rates]:
    """Every case of `CASES`, `series` simulated series each."""
    return [simulate(c, series, seed=seed + i, t=t) for i, c in enumerate(CASES)]
