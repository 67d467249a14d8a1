"""Order effects found in a run's own trials: is the first trial of a round
slower or faster than the rest, or is the trial run just after a given arm?

Estimated by the cross-over model (Jones & Kenward, *Design and Analysis of
Cross-Over Trials*, 3rd ed., 2014, ch. 4), least squares on the log values:
round + arm + first in round + carry-over of the arm run just before + error,
the carry-over effects summing to zero (each is the extra cost of following
that arm rather than an average one).  With two arms carry-over cannot be told
from the arms' own difference (it is aliased with it), so only the first
place is estimated.

The balanced schedule keeps a first-place effect out of every comparison's
centre, and a carry-over effect out of the comparisons that do not involve
the arm leaving it; both still widen the intervals, and a carry-over effect
biases the pairs of the arm that leaves it.  So they are named, as outliers
are: a first-place effect on every comparison of its metric, a carry-over
effect on the comparisons of its arm.  An effect is named when Holm over all
effects of the experiment's metrics finds it at 1 % (`ALPHA`): a warning that
makes a reader doubt a run should rarely come without cause (the selftest
measures how rarely, and how surely an 8 % effect is named).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from mmlab.judge.stats import holm

FIRST = "first in round"
ALPHA = 0.01         # Holm over the experiment's effects


@dataclass(frozen=True)
class OrderEffect:
    """A trial's extra cost for its place in the run, as a factor."""
    metric: str
    kind: str                 # FIRST, or "after <arm>"
    arm: str | None           # the arm whose carry-over it is; None for the first place
    factor: float
    low: float                # 95 % CI
    high: float
    p: float

    def __str__(self) -> str:
        return f"{self.kind} x{self.factor:.3f} (95% CI {self.low:.3f}..{self.high:.3f})"


@dataclass(frozen=True)
class Design:
    """The cross-over model's design matrix for one run's trials, and which
    of its columns are the order effects (None: the first place; i: the
    carry-over of arm i)."""
    x: np.ndarray
    effects: list[int | None]
    carry: int | None             # the arm whose carry-over the others sum to (its column absent)

    @classmethod
    def of(cls, arm: np.ndarray, rnd: np.ndarray, slot: np.ndarray, prev: np.ndarray,
           arms: int) -> Design:
        """Trials by arm index, round (any labels), position in the round and
        the arm run before it in the round (-1 for the first)."""
        rounds = np.unique(rnd)
        cols = [rnd == r for r in rounds] + [arm == a for a in range(1, arms)]
        cols.append(slot == 0)
        effects: list[int | None] = [None]
        carry = arms - 1 if arms >= 3 else None
        if carry is not None:
            cols += [(prev == a).astype(float) - (prev == carry) for a in range(carry)]
            effects += list(range(carry))
        return cls(np.column_stack(cols).astype(float), effects, carry)

    def fit(self, y: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, ...] | None:
        """(estimates, CI lows, CI highs, two-sided p), one row per effect
        (`rows`: the first place, then each arm's carry-over) and one column
        per column of `y` (log values, trials x series); None when the model
        cannot be fitted (too few trials, or not every effect estimable).

        Only differences between carry-overs can be told from the data (a
        constant added to every arm's and taken from the first place fits
        as well), so each is stated against the arm whose carry-over is the
        median: most arms leave nothing behind, so one that does stands
        out, and the first place is compared with a trial after that arm."""
        n, k = self.x.shape
        if np.linalg.matrix_rank(self.x) < k or n - k < 2:
            return None
        pinv = np.linalg.pinv(self.x)
        beta, df = pinv @ y, n - k
        s2 = ((y - self.x @ beta) ** 2).sum(0) / df
        first = k - len(self.effects)
        rows = np.eye(k)[first:]                     # the first place, then the carry-overs
        if self.carry is not None:                   # and the carry-over the others sum to
            rows = np.vstack([rows, -rows[1:].sum(0)])
        est = rows @ beta
        cov = rows @ pinv @ pinv.T @ rows.T          # times s2, per column
        if len(est) > 1:                             # against the median carry-over
            ref = np.argsort(est[1:], axis=0)[(len(est) - 2) // 2] + 1
            cols = np.arange(y.shape[1])
            est = est - est[ref, cols]
            var = (np.diag(cov)[:, None] + cov[ref, ref] - 2 * cov[:, ref]) * s2
        else:
            var = cov[:, :1] * s2
        se = np.sqrt(np.maximum(var, 0))
        t = sps.t.ppf((1 + level) / 2, df)
        with np.errstate(divide="ignore", invalid="ignore"):
            p = np.where(se > 1e-12, 2 * sps.t.sf(np.abs(est) / se, df), 1.0)
        return est, est - t * se, est + t * se, p

    @property
    def arms_of_rows(self) -> list[int | None]:
        """The arm of each row `fit` returns (None: the first place)."""
        return self.effects + ([self.carry] if self.carry is not None else [])


def found(fits: list[tuple], names: list[str],
          alpha: float) -> list[OrderEffect]:
    """The effects Holm over every fitted effect finds at `alpha`.  `fits`:
    (metric, arms of the rows, estimates, lows, highs, p) per metric, one
    column each."""
    flat = [(metric, arm, float(e[0]), float(lo[0]), float(hi[0]), float(p[0]))
            for metric, arms, est, low, high, pv in fits
            for arm, e, lo, hi, p in zip(arms, est, low, high, pv)]
    if not flat:
        return []
    adjusted = holm(np.array([f[5] for f in flat]))
    out = []
    for (metric, arm, e, lo, hi, p), q in zip(flat, adjusted):
        if q < alpha:
            factor, low, high = np.exp([e, lo, hi])
            out.append(OrderEffect(metric, FIRST if arm is None else f"after {names[arm]}",
                                   None if arm is None else names[arm], factor, low, high, p))
    return out


def effects(trials, arms: list[str], metrics: list[str],
            alpha: float = ALPHA) -> list[OrderEffect]:
    """The order effects found in a run: `trials` as the store reads them back
    (arm, round, slot, samples), of the arms `arms` (a plan's arms, controls
    left out: they run in rounds of their own)."""
    index = {a: i for i, a in enumerate(arms)}
    placed = [t for t in trials if t.arm in index and t.round is not None
              and t.slot is not None]
    at = {(t.round, t.slot): t.arm for t in placed}
    fits = []
    for metric in metrics:
        rows = [(t, v) for t in placed if (v := _value(t, metric)) is not None
                and (t.slot == 0 or (t.round, t.slot - 1) in at)]
        if not rows:
            continue
        arm, rnd, slot, prev = (np.array(col) for col in zip(*[
            (index[t.arm], t.round, t.slot, index[at[(t.round, t.slot - 1)]] if t.slot else -1)
            for t, _ in rows]))
        design = Design.of(arm, rnd, slot, prev, len(arms))
        fit = design.fit(np.log([[v] for _, v in rows]))
        if fit is not None:
            fits.append((metric, design.arms_of_rows, *fit))
    return found(fits, arms, alpha)


def _value(trial, metric: str) -> float | None:
    """A trial's value of `metric`: the median of its samples', if positive."""
    xs = [x for s in trial.samples if (x := s.metrics.get(metric)) is not None and x > 0
          and np.isfinite(x)]
    return float(np.median(xs)) if xs else None
