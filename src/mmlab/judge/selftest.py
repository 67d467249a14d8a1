"""`mmlab selftest verdicts`: how often the verdicts are right, measured by
simulation with the very functions `verdicts.judge` uses.

Each simulated experiment is a profile of three arms (a baseline and two
arms) and two metrics: a family of four tests.  Its trials are drawn from one
of four noise models, on the log scale, with every non-baseline arm slower by
the effect (1.0 is an A/A run).  It runs the minimum rounds, is judged at each
planned look exactly as the adaptive runner judges (paired estimate, Holm over
the tests still open, the look's share of alpha and of the interval's
confidence, first decisive verdict kept), and stops when every test is
decided or at the maximum.  Vectorised over experiments; no bootstrap (every
round is complete, so the paired method is always the one used).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mmlab.judge import stats
from mmlab.judge.criteria import HIGHER, LOWER, NO_CHANGE, UNDECIDED, Criteria, outcomes

ARMS, METRICS = 3, 2          # a family of (ARMS - 1) x METRICS = 4 tests


def _sigma(cv: float) -> float:
    """The log-scale sd of a lognormal with coefficient of variation `cv`."""
    return math.sqrt(math.log1p(cv * cv))


def _lognormal(cv: float) -> Callable:
    def draw(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return rng.normal(0, _sigma(cv), shape)
    return draw


def _mixed(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """2 % lognormal, and 10 % of the trials 30 % slower."""
    return rng.normal(0, _sigma(0.02), shape) + math.log(1.3) * (rng.random(shape) < 0.10)


def _drift(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A factor of CV 6 % per round shared by every arm and metric, times 1 % of
    each trial's own."""
    e, _, _, r = shape
    return rng.normal(0, _sigma(0.01), shape) + rng.normal(0, _sigma(0.06), (e, 1, 1, r))


@dataclass(frozen=True)
class Noise:
    name: str
    description: str
    draw: Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


NOISES = (Noise("LN2", "lognormal, CV 2%", _lognormal(0.02)),
          Noise("LN5", "lognormal, CV 5%", _lognormal(0.05)),
          Noise("MIX", "2%, plus 10% of trials +30%", _mixed),
          Noise("DRIFT", "round drift 6% shared by all arms, 1% own", _drift))


@dataclass(frozen=True)
class Cell:
    """One noise model at one effect, over `experiments` simulated profiles."""
    noise: str
    effect: float
    experiments: int
    family_alarms: float     # share of profiles with a regression or improvement claimed wrongly
    no_change: float         # share of tests judged "no change"
    detected: float          # share of tests judged the right change (regression)
    wrong_way: float         # share of tests judged a change in the wrong direction
    rounds: float            # mean rounds a profile ran


def simulate(noise: Noise, effect: float, criteria: Criteria = Criteria(),
             experiments: int = 2000, seed: int = 1) -> Cell:
    """Run `experiments` simulated profiles through the sequential verdicts."""
    rng = np.random.default_rng([seed, NOISES.index(noise), round(effect * 1e6)])
    looks = criteria.looks()
    x = noise.draw(rng, (experiments, ARMS, METRICS, looks[-1]))
    x[:, 1:] += math.log(effect)
    d = (x[:, 1:] - x[:, :1]).reshape(experiments, (ARMS - 1) * METRICS, looks[-1])
    tests = d.shape[1]
    outcome = np.full((experiments, tests), UNDECIDED)
    stopped_at = np.full(experiments, looks[-1])
    for k, n in enumerate(looks):
        open_ = outcome == UNDECIDED
        if not open_.any():
            break
        res = stats.paired(d[..., :n].reshape(-1, n), criteria.confidence_at(k),
                           criteria.outlier_z)
        p = np.where(open_, res.p.reshape(experiments, tests), np.nan)
        now = outcomes(res.centre.reshape(experiments, tests),
                           res.low.reshape(experiments, tests),
                           res.high.reshape(experiments, tests),
                           stats.adjust(p, criteria.correction), criteria.alpha_at(k),
                           criteria.tolerance)
        outcome = np.where(open_, now, outcome)
        finished = (outcome != UNDECIDED).all(1) & (stopped_at == looks[-1])
        stopped_at[finished & (open_.any(1))] = n
    changed = (outcome == HIGHER) | (outcome == LOWER)
    wrong = outcome == LOWER if effect > 1 else (outcome == HIGHER if effect < 1
                                                        else changed)
    return Cell(noise.name, effect, experiments,
                family_alarms=float(wrong.any(1).mean()) if effect == 1 else float("nan"),
                no_change=float((outcome == NO_CHANGE).mean()),
                detected=float((outcome == (HIGHER if effect > 1 else LOWER)).mean())
                if effect != 1 else float("nan"),
                wrong_way=float(wrong.mean()),
                rounds=float(stopped_at.mean()))


EFFECTS = (1.0, 1.05, 1.10)


@dataclass(frozen=True)
class Targets:
    """The issue's targets at the defaults."""
    family_alarms: float = 0.02
    aa_no_change: float = 0.90
    detect_10: float = 0.95
    max_rounds: int = 25

    def missed(self, cells: list[Cell], criteria: Criteria) -> list[str]:
        out = []
        if criteria.max_rounds > self.max_rounds:
            out.append(f"maximum rounds {criteria.max_rounds} > {self.max_rounds}")
        for c in cells:
            if c.effect == 1.0 and c.family_alarms > self.family_alarms:
                out.append(f"{c.noise}: family false alarms {c.family_alarms:.1%} > "
                           f"{self.family_alarms:.0%}")
            if c.effect == 1.0 and c.no_change < self.aa_no_change:
                out.append(f"{c.noise}: A/A no change {c.no_change:.1%} < "
                           f"{self.aa_no_change:.0%}")
            if abs(c.effect - 1.10) < 1e-9 and c.detected < self.detect_10:
                out.append(f"{c.noise}: +10% detected {c.detected:.1%} < {self.detect_10:.0%}")
        return out


def run(criteria: Criteria = Criteria(), experiments: int = 2000,
        seed: int = 1) -> list[Cell]:
    return [simulate(noise, effect, criteria, experiments, seed)
            for noise in NOISES for effect in EFFECTS]


def table_rows(cells: list[Cell]) -> list[list[str]]:
    """One row per noise model: the columns of `HEADER`."""
    by = {(c.noise, c.effect): c for c in cells}
    rows = []
    for noise in NOISES:
        aa, five, ten = (by[(noise.name, e)] for e in EFFECTS)
        rows.append([noise.name, noise.description, f"{aa.family_alarms:.1%}",
                     f"{aa.no_change:.1%}", f"{aa.rounds:.1f}", f"{five.detected:.1%}",
                     f"{five.no_change:.1%}", f"{ten.detected:.1%}", f"{ten.rounds:.1f}"])
    return rows


HEADER = ["noise", "model", "A/A false alarms (family of 4)", "A/A no change", "A/A rounds",
          "+5%: regression", "+5%: no change", "+10%: regression", "+10% rounds"]


