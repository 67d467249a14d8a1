"""`mmlab selftest verdicts`: how often the verdicts are right, measured by
simulation with the very functions `verdicts.judge` uses.

A simulated experiment has a profile's shape (`Shape`): its arms, the pairs
its baseline makes, its metrics, its looks and criteria, and the schedule its
seed draws; the defaults' shape is 3 arms (a baseline and two arms) and 2
metrics, a family of 4 tests.  Its trials are drawn from a noise model that
follows that schedule (noises.py), a change is put on one arm only (the arm
of the first pair), and it is judged at each planned look as the adaptive
runner judges: paired from 6 complete rounds (else the unpaired bootstrap,
Mann-Whitney and the noise veto), Holm over the tests still open, the look's
shares of alpha, of the interval's confidence and of the margin test, the
first decisive verdict kept; it stops when every test is decided or at the
maximum.  Vectorised over experiments.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from scipy import stats as sps

from mmlab.experiment.plan import pairs
from mmlab.judge import order, stats
from mmlab.judge.criteria import HIGHER, LOWER, NO_CHANGE, UNDECIDED, Criteria, outcomes
from mmlab.judge.noises import NOISES, Layout, Noise, lognormal

CHUNK = 2000                  # experiments judged at once (memory)


@dataclass(frozen=True)
class Shape:
    """What a profile's operating characteristics depend on.  `seed` is the
    schedule's: a profile's own (every rerun runs that schedule), or None
    for a schedule of its own per simulated experiment."""
    name: str
    arms: int
    pairs: tuple[tuple[int, int], ...]       # (arm, baseline) by index
    metrics: int
    criteria: Criteria = Criteria()
    seed: int | None = None

    @classmethod
    def of(cls, plan) -> Shape:
        """A plan's shape (experiment.plan.Plan; pairs as plan.pairs makes
        them).  A profile of one arm is run as two (`mmlab ab` and `narrow`
        add a kernel axis of two), the second against the first."""
        index = {a.name: i for i, a in enumerate(plan.arms)}
        found = tuple((index[p.arm.name], index[p.baseline.name]) for p in pairs(plan))
        return cls(plan.profile.name, max(2, len(plan.arms)), found or ((1, 0),),
                   len(plan.profile.metrics), Criteria.of(plan.profile), plan.profile.seed)

    @property
    def tests(self) -> int:
        return len(self.pairs) * self.metrics

    @property
    def changed(self) -> int:
        """The arm a simulated change is put on: the first pair's."""
        return self.pairs[0][0]

    def truth(self) -> np.ndarray:
        """Per test: +1 where the changed arm is the arm, -1 where it is the
        baseline, 0 where the test compares two unchanged arms."""
        return np.repeat([(a == self.changed) - (b == self.changed) for a, b in self.pairs],
                         self.metrics)

    def describe(self) -> str:
        return (f"{self.arms} arms, {len(self.pairs)} pairs x {self.metrics} metrics "
                f"({self.tests} tests), {self.criteria.describe()}, tolerance "
                f"{self.criteria.tolerance:.0%}")


DEFAULTS = Shape("defaults", 3, ((1, 0), (2, 0)), 2)


@lru_cache(maxsize=4)
def _layout(shape: Shape, seeds: tuple[int, ...]) -> Layout:
    return Layout.of(shape.arms, shape.criteria.looks()[-1], list(seeds), shape.metrics,
                     shape.changed, shape.arms - 1)


def _estimates(xa: np.ndarray, xb: np.ndarray, crit: Criteria,
               look: int) -> tuple[np.ndarray, ...]:
    """(low, high, margin low, margin high, p, vetoed) of every test of every
    row, from log values (rows, tests, rounds), as stats.estimate gives them."""
    rows, tests, n = xa.shape
    level, margin = crit.confidence_at(look), crit.margin_at(look)
    if n >= stats.MIN_PAIRS:
        res = stats.paired((xa - xb).reshape(-1, n), level, margin, crit.outlier_z)
        out: tuple[np.ndarray, ...] = (res.low, res.high, res.margin_low, res.margin_high, res.p)
        return (*(v.reshape(rows, tests) for v in out), np.zeros((rows, tests), bool))
    va, vb = np.exp(xa).reshape(-1, n), np.exp(xb).reshape(-1, n)
    (lo, hi), (mlo, mhi) = stats.bootstrap_ratio(va, vb, (level, margin))
    p = sps.mannwhitneyu(va, vb, alternative="two-sided", axis=-1).pvalue
    veto = (stats.robust_cv(va) > crit.max_cv) | (stats.robust_cv(vb) > crit.max_cv)
    out = (np.log(lo), np.log(hi), np.log(mlo), np.log(mhi), p, veto)
    return tuple(v.reshape(rows, tests) for v in out)


def judge_looks(x: np.ndarray, shape: Shape) -> tuple[np.ndarray, np.ndarray]:
    """Outcomes (experiments, tests) and the rounds each experiment ran, from
    log values (experiments, arms, metrics, rounds)."""
    crit, looks = shape.criteria, shape.criteria.looks()
    a, b = ([p[i] for p in shape.pairs] for i in (0, 1))
    e = x.shape[0]
    xa, xb = (x[:, idx].reshape(e, shape.tests, -1) for idx in (a, b))
    outcome = np.full((e, shape.tests), UNDECIDED)
    stopped = np.full(e, looks[-1])
    for k, n in enumerate(looks):
        rows = np.nonzero((outcome == UNDECIDED).any(1))[0]
        if rows.size == 0:
            break
        open_ = outcome[rows] == UNDECIDED
        low, high, mlow, mhigh, p, veto = _estimates(xa[rows, :, :n], xb[rows, :, :n], crit, k)
        adjusted = stats.adjust(np.where(open_, p, np.nan), crit.correction)
        now = outcomes(low, high, mlow, mhigh, adjusted, crit.alpha_at(k), crit.tolerance)
        outcome[rows] = np.where(open_ & ~veto, now, outcome[rows])
        stopped[rows[(outcome[rows] != UNDECIDED).all(1)]] = n
    return outcome, stopped


@dataclass(frozen=True)
class NoiseRates:
    """One noise model at one true change (on one arm), over `experiments`
    simulated profiles: rates per test and per profile."""
    noise: str
    effect: float
    experiments: int
    family_alarms: float     # profiles with a change claimed where none is, or the wrong way
    no_change: float         # unchanged tests judged "no change"
    all_no_change: float     # profiles whose every unchanged test is "no change"
    called: float            # changed tests called a change their way (NaN: none changed)
    all_called: float        # profiles whose every changed test is called so
    wrong_way: float         # changed tests called a change the other way
    said_same: float         # changed tests judged "no change"
    rounds: float            # mean rounds a profile ran


def rates(outcome: np.ndarray, stopped: np.ndarray, truth: np.ndarray, noise: str,
          effect: float) -> NoiseRates:
    """The rates of judged outcomes (experiments, tests) against the truth."""
    sign = np.sign(math.log(effect)) * truth
    null, moved = sign == 0, sign != 0
    up, down = sign > 0, sign < 0
    claimed = (outcome == HIGHER) | (outcome == LOWER)
    right = (up & (outcome == HIGHER)) | (down & (outcome == LOWER))
    wrong = (null & claimed) | (moved & claimed & ~right)
    nan = float("nan")

    def share(x, cols) -> float:
        return float(x[:, cols].mean()) if cols.any() else nan

    return NoiseRates(noise, effect, len(outcome), float(wrong.any(1).mean()),
                      share(outcome == NO_CHANGE, null),
                      float((outcome[:, null] == NO_CHANGE).all(1).mean()) if null.any() else nan,
                      share(right, moved),
                      float(right[:, moved].all(1).mean()) if moved.any() else nan,
                      share(claimed & ~right, moved), share(outcome == NO_CHANGE, moved),
                      float(stopped.mean()))


def simulate(noise: Noise, effect: float, shape: Shape = DEFAULTS, experiments: int = 2000,
             seed: int = 1, schedules: tuple[int, ...] | None = None) -> NoiseRates:
    """`experiments` simulated profiles of `shape` under `noise`, the changed
    arm slower by `effect` (1.0: an A/A run).  Each runs the profile's own
    schedule, or with no profile seed one of its own (`schedules`: which)."""
    return rates(*judged(noise, effect, shape, experiments, seed, schedules),
                 shape.truth(), noise.name, effect)


def judged(noise: Noise, effect: float, shape: Shape, experiments: int, seed: int,
           schedules: tuple[int, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The outcomes and rounds of `simulate`, before they are counted."""
    rng = np.random.default_rng([seed, zlib.crc32(noise.name.encode()), round(effect * 1e6)])
    if schedules is None:
        schedules = ((shape.seed,) * experiments if shape.seed is not None
                     else tuple(range(seed * 100_000, seed * 100_000 + experiments)))
    parts = []
    for i in range(0, experiments, CHUNK):
        lay = _layout(shape, schedules[i:i + CHUNK])
        x = noise.draw(rng, lay)
        x[:, shape.changed] += math.log(effect)
        parts.append(judge_looks(x, shape))
    outcomes, rounds = zip(*parts)
    return np.concatenate(outcomes), np.concatenate(rounds)


def effects(tolerance: float) -> tuple[float, ...]:
    """A/A, a change well inside the tolerance (0.6 of it: +3 % at 5 %), one
    at the tolerance and one of twice the tolerance (+10 % at 5 %)."""
    return 1.0, 1 + 0.6 * tolerance, 1 + tolerance, 1 + 2 * tolerance


def simulate_all(shape: Shape = DEFAULTS, experiments: int = 2000, seed: int = 1,
                 noises: tuple[Noise, ...] = NOISES) -> list[NoiseRates]:
    """Every noise model at each of `effects`: the table the goals are held to."""
    return [simulate(n, e, shape, experiments, seed) for n in noises
            for e in effects(shape.criteria.tolerance)]


@dataclass(frozen=True)
class VerdictGoals:
    """The published goals: false alarms over a profile's family, "no
    change" in A/A runs, a change inside the tolerance rarely called one and
    twice the tolerance found, within 25 rounds; the noise models they are
    held to (the others are reported, not promised)."""
    family_alarms: float = 0.02
    aa_no_change: float = 0.90
    inside_called: float = 0.05
    detect: float = 0.95
    max_rounds: int = 25
    held: tuple[str, ...] = ("LN2", "LN5", "MIX", "DRIFT", "TREND", "FIRST", "AR1", "T3")

    def missed(self, rated: list[NoiseRates], criteria: Criteria) -> list[str]:
        out = []
        if criteria.max_rounds > self.max_rounds:
            out.append(f"maximum rounds {criteria.max_rounds} > {self.max_rounds}")
        tol = criteria.tolerance
        for c in (c for c in rated if c.noise in self.held):
            change = f"{c.noise} {c.effect - 1:+.0%}"
            if c.effect == 1.0 and c.family_alarms > self.family_alarms:
                out.append(f"{c.noise}: family false alarms {c.family_alarms:.1%} > "
                           f"{self.family_alarms:.0%}")
            if c.effect == 1.0 and c.no_change < self.aa_no_change:
                out.append(f"{c.noise}: A/A no change {c.no_change:.1%} < "
                           f"{self.aa_no_change:.0%}")
            if math.isclose(c.effect, 1 + 0.6 * tol) and c.called > self.inside_called:
                out.append(f"{change}: called a change {c.called:.1%} > "
                           f"{self.inside_called:.0%}")
            if math.isclose(c.effect, 1 + 2 * tol) and c.called < self.detect:
                out.append(f"{change}: found {c.called:.1%} < {self.detect:.0%}")
        return out


def table_rows(rated: list[NoiseRates], noises: tuple[Noise, ...] = NOISES) -> list[list[str]]:
    """One row per noise model: the columns of `header`."""
    rows = []
    for noise in noises:
        aa, inside, at, twice = sorted((c for c in rated if c.noise == noise.name),
                                       key=lambda c: c.effect)
        rows.append([noise.name, _pct(aa.family_alarms),
                     _pct(aa.no_change), _pct(aa.all_no_change), f"{aa.rounds:.1f}",
                     _pct(inside.called), _pct(at.called), _pct(at.said_same),
                     _pct(twice.called), _pct(twice.all_called), f"{twice.rounds:.1f}"])
    return rows


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.1%}"


def header(tolerance: float) -> list[str]:
    """The columns of `table_rows`: per profile or per test, as marked."""
    inside, at, twice = (f"{e - 1:+.0%}" for e in effects(tolerance)[1:])
    return ["noise", "A/A false alarms /profile", "A/A no change /test",
            "A/A no change /profile", "A/A rounds", f"{inside} called /test",
            f"{at} called /test", f"{at} no change /test", f"{twice} found /test",
            f"{twice} found /profile", f"{twice} rounds"]


# ---------------------------------------------------------------- noise levels

CVS = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.10, 0.15, 0.20, 0.30)


def reach(shape: Shape, experiments: int = 400, seed: int = 1,
          goals: VerdictGoals = VerdictGoals()) -> float | None:
    """The largest lognormal CV (of `CVS`) up to which the shape reaches its
    decisions: A/A "no change" and twice the tolerance found at the goal
    rates; None when not even the smallest.  The rates fall as noise grows,
    so the search stops at the first CV that misses."""
    best = None
    for cv in CVS:
        aa = simulate(lognormal(cv), 1.0, shape, experiments, seed)
        if aa.no_change < goals.aa_no_change:
            break
        twice = simulate(lognormal(cv), 1 + 2 * shape.criteria.tolerance, shape,
                         experiments, seed)
        if twice.called < goals.detect:
            break
        best = cv
    return best


def alarm_bound(curve: list[tuple[float, float]], target: float) -> float | None:
    """The largest CV up to which every simulated false-alarm rate of
    `curve` stays at or under `target`."""
    held = None
    for cv, alarms in curve:
        if alarms > target:
            break
        held = cv
    return held


def alarms_by_noise(shape: Shape = DEFAULTS, experiments: int = 2000, seed: int = 1,
                    cvs: tuple[float, ...] = CVS) -> list[tuple[float, float]]:
    """(CV, A/A family false alarms) at each lognormal CV."""
    return [(cv, simulate(lognormal(cv), 1.0, shape, experiments, seed).family_alarms)
            for cv in cvs]


def order_named(noise: Noise, effect: float, shape: Shape = DEFAULTS, experiments: int = 2000,
                seed: int = 1) -> float:
    """The share of simulated profiles in which order.py names an order
    effect, as `verdicts.judge` would: the cross-over model fitted to each
    metric, Holm over the experiment's effects.  One schedule (the
    profile's seed, else `seed`), so one design serves every experiment."""
    one = replace(shape, seed=seed if shape.seed is None else shape.seed)
    lay = _layout(one, (one.seed,))
    a, r = np.meshgrid(np.arange(shape.arms), np.arange(lay.shape[-1]), indexing="ij")
    slot = lay.slot[0]
    design = order.Design.of(a.ravel(), r.ravel(), slot.ravel(),
                             np.where(slot > 0, lay.prev[0], -1).ravel(), shape.arms)
    rng = np.random.default_rng([seed, zlib.crc32(noise.name.encode()), round(effect * 1e6), 1])
    x = noise.draw(rng, _layout(one, (one.seed,) * experiments))
    x[:, shape.changed] += math.log(effect)
    y = x.transpose(1, 3, 0, 2).reshape(shape.arms * lay.shape[-1], -1)   # trials x (e, metric)
    fit = design.fit(y)
    if fit is None:
        return float("nan")
    p = fit[3].reshape(-1, experiments, shape.metrics).transpose(1, 0, 2).reshape(experiments, -1)
    return float((stats.holm(p) < order.ALPHA).any(1).mean())

