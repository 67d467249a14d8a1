"""The selftest's noise models: what a run's trials see, drawn on the log
scale per experiment, arm, metric and round, following the schedule each
simulated experiment ran (`Layout`), so a trend, the first place in a round,
the state the previous trial left and autocorrelation in run order reach the
verdicts as they would reach the runner's.

Four models are those of the first selftest (LN2, LN5, MIX, DRIFT); the
others are the disturbances a machine adds, each on 2 % trial noise (5 % for
AR1, whose correlation removes most of it from a round's ratios), so that
what a row shows is the disturbance, not the noise under it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import signal

from mmlab.experiment.schedule import schedule, slots


def sigma(cv: float) -> float:
    """The log-scale sd of a lognormal with coefficient of variation `cv`."""
    return math.sqrt(math.log1p(cv * cv))


@dataclass(frozen=True)
class Layout:
    """Where each simulated trial ran, per experiment, arm and round: its
    position in the round, the arm run just before it (-1: none), and its
    index in the run order.  `changed` is the arm a simulated change is put
    on, `noisy` the arm given more variance by the unequal-variance model."""
    slot: np.ndarray
    prev: np.ndarray
    step: np.ndarray
    metrics: int
    changed: int
    noisy: int

    @property
    def shape(self) -> tuple[int, int, int, int]:
        e, a, r = self.slot.shape
        return e, a, self.metrics, r

    @classmethod
    def of(cls, arms: int, rounds: int, seeds: list[int], metrics: int, changed: int,
           noisy: int) -> Layout:
        """The layout of one experiment per seed, each run in its seed's schedule."""
        one: dict[int, tuple[np.ndarray, ...]] = {}
        for s in set(seeds):
            order = schedule([str(i) for i in range(arms)], rounds, s)
            arm = np.array([int(name) for _, name in order])
            rnd = np.array([r for r, _ in order])
            slot, prev, step = (np.zeros((arms, rounds), int) for _ in range(3))
            slot[arm, rnd] = slots(order)
            prev[arm, rnd] = np.concatenate([[-1], arm[:-1]])
            step[arm, rnd] = np.arange(len(order))
            one[s] = slot, prev, step
        slot, prev, step = (np.stack([one[s][k] for s in seeds]) for k in range(3))
        return cls(slot, prev, step, metrics, changed, noisy)


Draw = Callable[[np.random.Generator, Layout], np.ndarray]


def _own(cv: float) -> Draw:
    def draw(rng: np.random.Generator, lay: Layout) -> np.ndarray:
        return rng.normal(0, sigma(cv), lay.shape)
    return draw


def _mixed(rng: np.random.Generator, lay: Layout) -> np.ndarray:
    """2 % lognormal, and 10 % of the trials 30 % slower."""
    return _own(0.02)(rng, lay) + math.log(1.3) * (rng.random(lay.shape) < 0.10)


def _drift(rng: np.random.Generator, lay: Layout) -> np.ndarray:
    """A factor of CV 6 % per round shared by every arm and metric, times 1 %
    of each trial's own."""
    e, _, _, r = lay.shape
    return _own(0.01)(rng, lay) + rng.normal(0, sigma(0.06), (e, 1, 1, r))


def _trend(rng: np.random.Generator, lay: Layout) -> np.ndarray:
    """+20 % from the first trial to the last, in run order."""
    growth = lay.step / max(1, lay.step.max())
    return _own(0.02)(rng, lay) + math.log(1.2) * growth[:, :, None, :]


def _first(rng: np.random.Generator, lay: Layout) -> np.ndarray:
    """The first trial of every round 8 % slower (a cold cache, a settling guest)."""
    return _own(0.02)(rng, lay) + math.log(1.08) * (lay.slot == 0)[:, :, None, :]


def _carry(rng: np.random.Generator, lay: Layout) -> np.ndarray:
    """The trial run just after the changed arm 8 % slower: state it leaves
    behind (swap, page cache) for whoever comes next."""
    return _own(0.02)(rng, lay) + math.log(1.08) * (lay.prev == lay.changed)[:, :, None, :]


def _ar1(rng: np.random.Generator, lay: Layout, rho: float = 0.7) -> np.ndarray:
    """5 % noise correlated from trial to trial in run order, rho 0.7: a
    machine's slow wander."""
    e, _, m, _ = lay.shape
    steps = int(lay.step.max()) + 1
    z = rng.normal(0, 1, (e, m, steps))
    z[..., 0] /= math.sqrt(1 - rho * rho)                   # start in the stationary state
    z = signal.lfilter([sigma(0.05) * math.sqrt(1 - rho * rho)], [1, -rho], z, axis=-1)
    return z[np.arange(e)[:, None, None, None], np.arange(m)[None, None, :, None],
             lay.step[:, :, None, :]]


def _student(rng: np.random.Generator, lay: Layout) -> np.ndarray:
    """Student t with 3 degrees of freedom at scale 2 %: heavy tails."""
    return 0.02 * rng.standard_t(3, lay.shape)


def _bimodal(rng: np.random.Generator, lay: Layout) -> np.ndarray:
    """2 %, and each trial in one of two modes 10 % apart, as when a THP
    allocation succeeds or not."""
    return _own(0.02)(rng, lay) + math.log(1.1) * (rng.random(lay.shape) < 0.5)


def _unequal(rng: np.random.Generator, lay: Layout) -> np.ndarray:
    """2 %, and one arm with 20 times the variance (8.9 %)."""
    x = _own(0.02)(rng, lay)
    x[:, lay.noisy] *= math.sqrt(20)
    return x


@dataclass(frozen=True)
class Noise:
    name: str
    description: str
    draw: Draw


NOISES = (Noise("LN2", "lognormal, CV 2%", _own(0.02)),
          Noise("LN5", "lognormal, CV 5%", _own(0.05)),
          Noise("MIX", "2%, plus 10% of trials +30%", _mixed),
          Noise("DRIFT", "round drift 6% shared by all arms, 1% own", _drift),
          Noise("TREND", "2%, +20% over the run", _trend),
          Noise("FIRST", "2%, first in each round +8%", _first),
          Noise("CARRY", "2%, trial after the changed arm +8%", _carry),
          Noise("AR1", "5%, autocorrelated in run order, rho 0.7", _ar1),
          Noise("T3", "Student t, 3 df, scale 2%", _student),
          Noise("BIMODAL", "2%, two modes 10% apart", _bimodal),
          Noise("UNEQUAL", "2%, one arm 20x the variance", _unequal))


def lognormal(cv: float) -> Noise:
    """Plain lognormal noise of CV `cv` (a profile's own noise level)."""
    return Noise(f"LN{cv * 100:g}", f"lognormal, CV {cv:.0%}", _own(cv))


def noise(name: str) -> Noise:
    """A model by name, or LN<cv%> for any CV (LN8: 8 %)."""
    found = next((n for n in NOISES if n.name == name.upper()), None)
    if found:
        return found
    if name.upper().startswith("LN"):
        return lognormal(float(name[2:]) / 100)
    raise ValueError(f"unknown noise model {name!r}: "
                     f"one of {', '.join(n.name for n in NOISES)} or LN<cv%>")
