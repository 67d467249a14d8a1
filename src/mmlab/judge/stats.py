"""Summaries of samples, and the judgement of one arm against its baseline.

Each trial is one observation (a trial with several samples counts as its
median: samples of one process are not independent).  Where both arms ran in
the same rounds the analysis is paired: the log ratio arm/baseline of each
round, its Hodges-Lehmann centre with the distribution-free interval from the
Wilcoxon signed-rank distribution, and the signed-rank test (Hodges & Lehmann
1963; Wilcoxon 1945; Hollander & Wolfe, *Nonparametric Statistical Methods*,
ch. 3).  When two or more rounds are outliers (modified Z-score above 3.5,
Iglewicz & Hoaglin 1993) the ranks' tails are theirs, and the median of the
round ratios with its order-statistic interval and the sign test take over
(Hogg 1974: the data choose the rank test).  With too few complete rounds the
arms are compared as independent groups (bootstrap of the ratio of medians,
Mann-Whitney U).

Everything that decides is vectorised over rows, so the operating
characteristics in `selftest` run this very code on thousands of simulated
experiments at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import cache

import numpy as np
from scipy import stats

from mmlab.experiment.limits import MIN_PAIRS  # complete rounds for the paired analysis
from mmlab.judge.criteria import Criteria
from mmlab.judge.measurements import Observations

MIN_SAMPLES = 3       # trials per arm below which nothing is judged
SIGN_TEST_OUTLIERS = 2    # outlier rounds from which median and sign test replace HL/Wilcoxon


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
    rcv: float     # robust CV: 1.4826 * MAD / median (equals the CV for normal data)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def finite(values: Iterable[float | None]) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)


def summarize(values: Iterable[float | None]) -> Summary:
    """The per-arm statistics of one metric, over its finite values (a
    sample may lack a metric); NaN where undefined (n < 2)."""
    x = finite(values)
    if x.size == 0:
        nan = float("nan")
        return Summary(0, nan, nan, nan, nan, nan, nan, nan, nan)
    mean = float(x.mean())
    stdev = float(x.std(ddof=1)) if x.size > 1 else float("nan")
    med = float(np.median(x))
    mad = float(np.median(np.abs(x - med)))
    return Summary(
        n=int(x.size), median=med, mean=mean, stdev=stdev,
        cv=stdev / abs(mean) if mean else float("nan"),
        mad=mad, min=float(x.min()), max=float(x.max()), rcv=float(robust_cv(x)))


def robust_sd(x) -> np.ndarray:
    """1.4826 MAD along the last axis: the sd for normal data, and one
    disturbed trial barely moves it."""
    x = np.asarray(x, dtype=float)
    return 1.4826 * np.median(np.abs(x - np.median(x, axis=-1, keepdims=True)), axis=-1)


def robust_cv(x) -> np.ndarray:
    """robust_sd / |median| along the last axis; NaN where the median is 0."""
    med = np.abs(np.median(x, axis=-1))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(med != 0, robust_sd(x) / med, np.nan)


def paired_noise(d) -> np.ndarray:
    """The noise paired log ratios `d` show, as the CV of one trial: their
    robust sd over sqrt 2 (a ratio has two trials' noise).  The selftest's
    noise levels are in the same unit, so `max_cv` reads against them."""
    return robust_sd(d) / math.sqrt(2)


@dataclass(frozen=True)
class Separation:
    """Per row, on the log scale, what the count rule reads
    (criteria.count_outcomes): the step of the medians, the noisier arm's
    robust CV, and the smallest and largest log ratio of any trial of the
    arm to any of the baseline (the sets are apart where these share a
    sign)."""
    step: np.ndarray
    noise: np.ndarray
    low: np.ndarray
    high: np.ndarray


def separation(a, b) -> Separation:
    """The count rule's figures of arm values `a` against baseline values
    `b` (rows of positive trials; the rounds' pairing does not enter: a
    count carries no drift for a pair to cancel)."""
    with np.errstate(divide="ignore", invalid="ignore"):     # a zero count: -inf, undecided
        la, lb = (np.log(np.atleast_2d(np.asarray(x, dtype=float))) for x in (a, b))
        return Separation(np.median(la, -1) - np.median(lb, -1),
                          np.maximum(robust_sd(la), robust_sd(lb)),
                          la.min(-1) - lb.max(-1), la.max(-1) - lb.min(-1))




# ---------------------------------------------------------------- vectorised inference

@cache
def _signed_rank_cdf(n: int) -> np.ndarray:
    """P(T+ <= t), t = 0..n(n+1)/2, for the signed-rank statistic of n pairs
    without ties (exact, by counting subsets)."""
    m = n * (n + 1) // 2
    p = np.zeros(m + 1)
    p[0] = 1.0
    for k in range(1, n + 1):
        q = p.copy()
        q[k:] += p[:m + 1 - k]
        p = q / 2
    return np.cumsum(p)


def _order_index(cdf: np.ndarray, level: float) -> int:
    """The 1-based order statistic C of a distribution-free interval
    [X_(C), X_(M+1-C)]: the largest C with P(T <= C-1) <= (1-level)/2.
    0 means no interval at this level (too few observations)."""
    return int(np.searchsorted(cdf, (1 - level) / 2 * (1 + 1e-9), side="right"))


@dataclass(frozen=True)
class Paired:
    """Per row: centre, interval and two-sided p of the log ratios, the wider
    or narrower interval whose ends are the one-sided bounds of the test that
    the change exceeds the tolerance (`margin_low`, `margin_high`), and
    whether median/sign test was used (else Hodges-Lehmann/Wilcoxon)."""
    centre: np.ndarray
    low: np.ndarray
    high: np.ndarray
    margin_low: np.ndarray
    margin_high: np.ndarray
    p: np.ndarray
    sign: np.ndarray
    outliers: np.ndarray       # bool, per row and round


def modified_z(d: np.ndarray) -> np.ndarray:
    """|0.6745 (x - median) / MAD| per element (Iglewicz & Hoaglin 1993);
    0 where the MAD is 0."""
    med = np.median(d, axis=-1, keepdims=True)
    mad = np.median(np.abs(d - med), axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = 0.6745 * np.abs(d - med) / mad
    return np.where(mad > 0, z, 0.0)


def _between(s: np.ndarray, cdf: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """The distribution-free `level` interval [s_(C), s_(M+1-C)] of sorted
    rows `s`, C read off the statistic's `cdf`; infinite when too few."""
    c = _order_index(cdf, level)
    if c == 0:
        inf = np.full(s.shape[:-1], np.inf)
        return -inf, inf
    return s[..., c - 1], s[..., s.shape[-1] - c]


def hodges_lehmann(d: np.ndarray, *levels: float) -> tuple[np.ndarray, list]:
    """Centre and an interval per level from the Walsh averages
    (d_i + d_j) / 2, i <= j: their median, and the order statistics the
    signed-rank distribution gives (Hollander & Wolfe, section 3.3)."""
    n = d.shape[-1]
    i, j = np.triu_indices(n)
    walsh = np.sort((d[..., i] + d[..., j]) / 2, axis=-1)
    cdf = _signed_rank_cdf(n)
    return np.median(walsh, axis=-1), [_between(walsh, cdf, level) for level in levels]


def median_sign(d: np.ndarray, *levels: float) -> tuple[np.ndarray, list, np.ndarray]:
    """Median, an order-statistic interval (binomial) per level and the
    two-sided sign test's p."""
    n = d.shape[-1]
    s = np.sort(d, axis=-1)
    cdf = stats.binom.cdf(np.arange(n + 1), n, 0.5)
    pos, nonzero = (d > 0).sum(-1), (d != 0).sum(-1)
    p = np.minimum(1.0, 2 * np.minimum(stats.binom.cdf(pos, nonzero, 0.5),
                                       stats.binom.sf(pos - 1, nonzero, 0.5)))
    return (np.median(d, axis=-1), [_between(s, cdf, level) for level in levels],
            np.where(nonzero > 0, p, 1.0))


def paired(d: np.ndarray, level: float, margin_level: float,
           outlier_z: float = 3.5) -> Paired:
    """Paired inference on log ratios `d` (rows: comparisons, columns:
    rounds): the `level` interval, and the `margin_level` interval whose ends
    are the one-sided (1 + margin_level) / 2 bounds of the margin test."""
    d = np.atleast_2d(np.asarray(d, dtype=float))
    outliers = modified_z(d) > outlier_z
    centre, ((low, high), (mlow, mhigh)) = hodges_lehmann(d, level, margin_level)
    with np.errstate(invalid="ignore"):
        p = np.atleast_1d(stats.wilcoxon(d, axis=-1).pvalue)
    p = np.where(np.isfinite(p), p, 1.0)          # every ratio exactly 1
    sign = outliers.sum(-1) >= SIGN_TEST_OUTLIERS
    if sign.any():
        mc, ((ml, mh), (mml, mmh)), mp = median_sign(d, level, margin_level)
        centre, low, high, mlow, mhigh, p = (
            np.where(sign, b, a) for a, b in ((centre, mc), (low, ml), (high, mh),
                                               (mlow, mml), (mhigh, mmh), (p, mp)))
    return Paired(centre, low, high, mlow, mhigh, p, sign, outliers)


def holm(p: np.ndarray) -> np.ndarray:
    """Holm (1979) step-down adjusted p-values along the last axis; NaN (no
    test) stays NaN and does not count in the family."""
    p = np.asarray(p, dtype=float)
    m = np.isfinite(p).sum(-1, keepdims=True)
    filled = np.where(np.isfinite(p), p, np.inf)
    order = np.argsort(filled, axis=-1)
    ranked = np.take_along_axis(filled, order, -1)
    factor = m - np.arange(p.shape[-1])
    adj = np.minimum(1.0, np.maximum.accumulate(ranked * np.maximum(factor, 1), axis=-1))
    out = np.empty_like(adj)
    np.put_along_axis(out, order, adj, -1)
    return np.where(np.isfinite(p), out, np.nan)


def adjust(p: np.ndarray, correction: str) -> np.ndarray:
    return holm(p) if correction == "holm" else np.asarray(p, dtype=float)


# ---------------------------------------------------------------- one comparison

@dataclass(frozen=True)
class Outlier:
    """A trial far outside its round's pattern: kept, and named."""
    round: int | None
    arm: str
    position: int | None       # planned position of the trial (0-based)
    factor: float              # its value / its arm's median

    def __str__(self) -> str:
        """'round 4 B (trial 8) x1.80 its arm's median'; a metric with a tiny
        spread has outliers close to their median, so the factor gets the
        digits that tell it from 1 (x1.004, never x1.00)."""
        where = f"round {self.round} " if self.round is not None else ""
        pos = f" (trial {self.position})" if self.position is not None else ""
        digits = next((n for n in range(2, 7) if round(self.factor, n) != 1), 6)
        return f"{where}{self.arm}{pos} x{self.factor:.{digits}f} its arm's median"


@dataclass(frozen=True)
class Estimate:
    """The figures of one comparison at one look, before the family's correction."""
    method: str                # paired-wilcoxon, paired-sign, unpaired, or "" (none)
    n: int
    n_baseline: int
    median: float
    median_baseline: float
    ratio: float               # exp(centre of the log ratios)
    ci_low: float
    ci_high: float
    p_value: float
    confidence: float
    cv: float
    cv_baseline: float
    rcv: float
    rcv_baseline: float
    noisy: str                 # "" or the noise above max_cv the verdict sees
    outliers: tuple[Outlier, ...]
    problem: str = ""          # why there is no estimate
    margin_low: float = float("nan")    # one-sided bounds of the margin test
    margin_high: float = float("nan")

    @property
    def log(self) -> tuple[float, ...]:
        """The ratio, the interval and the margin test's bounds as log ratios."""
        return tuple(math.log(x) if x > 0 else float("nan")
                     for x in (self.ratio, self.ci_low, self.ci_high, self.margin_low,
                               self.margin_high))


def estimate(arm: str, baseline: str, a: Observations, b: Observations, criteria: Criteria,
             look: int) -> Estimate:
    """Centre, interval (at this look's confidence) and p of arm / baseline,
    and whether the noise the verdict sees is above `max_cv`: paired, the
    spread of the rounds' log ratios (a drift shared by the round cancels);
    unpaired, each arm's own."""
    sa, sb = summarize(a.values), summarize(b.values)
    level = criteria.confidence_at(look)
    nan = float("nan")
    noisy = ", ".join(f"{name} robust CV {cv:.1%}" for name, cv in ((arm, sa.rcv),
                                                                    (baseline, sb.rcv))
                      if np.isfinite(cv) and cv > criteria.max_cv)

    def make(method, n, nb, ratio, lo, hi, p, outliers=(), problem="", margin=(nan, nan),
             noisy=noisy):
        return Estimate(method, n, nb, sa.median, sb.median, ratio, lo, hi, p, level, sa.cv,
                        sb.cv, sa.rcv, sb.rcv, noisy, tuple(outliers), problem, *margin)

    if sa.n < MIN_SAMPLES or sb.n < MIN_SAMPLES:
        return make("", sa.n, sb.n, nan, nan, nan, nan,
                    problem=f"too few samples ({sa.n} vs {sb.n}, need {MIN_SAMPLES})")
    if sb.median == 0:
        return make("", sa.n, sb.n, nan, nan, nan, nan, problem="baseline median is 0")
    ra, rb = a.by_round(), b.by_round()
    common = sorted(ra.keys() & rb.keys())
    positive = min(a.values) > 0 and min(b.values) > 0     # log ratios exist
    margin = criteria.margin_at(look)
    if len(common) >= MIN_PAIRS and positive:
        d = np.log([ra[r][0] / rb[r][0] for r in common])
        res = paired(d, level, margin, criteria.outlier_z)
        named = [_culprit(r, arm, baseline, ra[r], rb[r], sa.median, sb.median)
                 for r, out in zip(common, res.outliers[0]) if out]
        ratio, lo, hi, mlo, mhi = (math.exp(float(x[0])) for x in (
            res.centre, res.low, res.high, res.margin_low, res.margin_high))
        noise = float(paired_noise(d))
        return make("paired-sign" if res.sign[0] else "paired-wilcoxon", len(common),
                    len(common), ratio, lo, hi, float(res.p[0]), named, margin=(mlo, mhi),
                    noisy=f"paired noise {noise:.1%} per trial" if noise > criteria.max_cv
                    else "")
    x, y = np.asarray(a.values), np.asarray(b.values)
    (low, high), (margin_low, margin_high) = bootstrap_ratio(x, y, (level, margin))
    p = float(stats.mannwhitneyu(x, y, alternative="two-sided").pvalue)
    named = [Outlier(None, name, None, v / med)
             for name, vals, med in ((arm, x, sa.median), (baseline, y, sb.median))
             for v, z in zip(vals, modified_z(vals)) if z > criteria.outlier_z and med]
    return make("unpaired", sa.n, sb.n, sa.median / sb.median, float(low[0]), float(high[0]),
                p, named, margin=(float(margin_low[0]), float(margin_high[0])))


def _culprit(rnd: int, arm: str, baseline: str, a: tuple[float, int | None],
             b: tuple[float, int | None], med_a: float, med_b: float) -> Outlier:
    """Of the two trials of an outlying round, the one further from its arm's median."""
    fa, fb = a[0] / med_a, b[0] / med_b
    if abs(math.log(fa)) >= abs(math.log(fb)):
        return Outlier(rnd, arm, a[1], fa)
    return Outlier(rnd, baseline, b[1], fb)


@cache
def median_law(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The exact bootstrap distribution of the median of n values: a
    resample's median is (x_(i) + x_(j)) / 2 of the sorted sample with
    probability w, over 0-based index pairs (i, j); i = j for odd n (Maritz &
    Jarrett 1978).  K_i, the draws at or below x_(i), is Binomial(n, i/n);
    for even n the two middle order statistics come from the multinomial
    counts below, at, between and above x_(i) and x_(j)."""
    if n % 2:
        k = np.arange(n + 1)
        cdf = stats.binom.sf((n - 1) // 2, n, k / n)       # P(at least (n+1)/2 draws <= x_(k))
        return np.arange(n), np.arange(n), np.diff(cdf)
    m, f = n // 2, math.factorial
    pairs, w = [], []
    for i in range(1, n + 1):
        below, above = (i - 1) / n, (n - i) / n
        pairs.append((i, i))
        w.append(sum(f(n) / (f(a) * f(b) * f(n - a - b)) * below ** a * (1 / n) ** b
                     * above ** (n - a - b) for a in range(m) for b in range(m + 1 - a, n - a + 1)))
        for j in range(i + 1, n + 1):
            pairs.append((i, j))
            w.append(sum(f(n) / (f(a) * f(m - a) * f(c) * f(m - c)) * below ** a
                         * (1 / n) ** (m - a + c) * ((n - j) / n) ** (m - c)
                         for a in range(m) for c in range(1, m + 1)))
    i, j = np.array(pairs).T - 1
    return i, j, np.array(w)


def bootstrap_ratio(x, y, levels: tuple[float, ...]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Percentile bootstrap intervals of median(x) / median(y) at each of
    `levels`, per row, the arms resampled independently (Efron & Tibshirani
    1993, ch. 13), computed exactly: the ideal bootstrap that resampling
    approaches, so no resampling seed and no Monte Carlo error, and fast
    enough for the selftest to run it on every simulated experiment."""
    x, y = (np.sort(np.atleast_2d(np.asarray(v, dtype=float)), axis=-1) for v in (x, y))
    (ia, ja, wa), (ib, jb, wb) = median_law(x.shape[-1]), median_law(y.shape[-1])
    ma, mb = (x[..., ia] + x[..., ja]) / 2, (y[..., ib] + y[..., jb]) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (ma[..., :, None] / mb[..., None, :]).reshape(len(x), -1)
    order = np.argsort(ratio, axis=-1)
    ratio = np.take_along_axis(ratio, order, -1)
    cdf = np.cumsum(np.outer(wa, wb).ravel()[order], axis=-1)

    def quantile(q: float) -> np.ndarray:          # the smallest ratio with G(r) >= q
        at = np.minimum((cdf < q - 1e-12).sum(-1), ratio.shape[-1] - 1)
        return np.take_along_axis(ratio, at[:, None], -1)[:, 0]

    return [(quantile((1 - level) / 2), quantile((1 + level) / 2)) for level in levels]
