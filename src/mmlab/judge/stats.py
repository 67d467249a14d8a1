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

import hashlib
import math
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from functools import lru_cache

import numpy as np
from scipy import stats

MIN_SAMPLES = 3       # trials per arm below which nothing is judged
MIN_PAIRS = 6         # complete rounds for the paired analysis: 5 pairs cannot give p < 0.05
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


def finite(values) -> np.ndarray:
    return np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)


def summarize(values: list[float]) -> Summary:
    """The per-arm statistics of one metric; NaN where undefined (n < 2)."""
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
        mad=mad, min=float(x.min()), max=float(x.max()),
        rcv=1.4826 * mad / abs(med) if med else float("nan"))


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


# ---------------------------------------------------------------- criteria and looks

CORRECTIONS = ("holm", "none")


@dataclass(frozen=True)
class Criteria:
    """What a verdict needs, built once from the profile.

    `alpha` bounds the false alarms (a regression or improvement claimed where
    there is none) over the whole family of tests of a profile and over all
    looks; `confidence` is the level of the interval, which is also the
    "no change" test (two one-sided tests at (1 - confidence) / 2 each,
    Schuirmann 1987).  Both budgets are split over the planned looks in the
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
    max_cv: float = 0.10
    alpha: float = 0.05
    confidence: float = 0.90
    min_rounds: int = 12
    max_rounds: int = 25
    correction: str = "holm"
    interim_alpha: float = 0.10       # share of alpha each interim look spends
    interim_confidence: float = 0.02  # share of (1 - confidence) each interim look spends
    growth: float = 1.5           # each look has about this many times the rounds of the last
    outlier_z: float = 3.5
    resamples: int = 4999         # bootstrap, unpaired fallback only

    def __post_init__(self) -> None:
        if self.correction not in CORRECTIONS:
            raise ValueError(f"correction {self.correction!r}: expected one of {CORRECTIONS}")
        if self.max_rounds < self.min_rounds:
            object.__setattr__(self, "max_rounds", self.min_rounds)

    @classmethod
    def of(cls, profile) -> Criteria:
        """From a Profile (experiment.Profile; duck-typed to keep stats free of it)."""
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


def comparison_seed(seed: int, *names: str) -> int:
    """A bootstrap seed of its own per comparison, derived from the profile's."""
    h = hashlib.sha256("\0".join((str(seed), *names)).encode()).digest()
    return int.from_bytes(h[:8], "little")


# ---------------------------------------------------------------- vectorised inference

@lru_cache(maxsize=None)
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
    """Per row: centre, interval and two-sided p of the log ratios, and
    whether median/sign test was used (else Hodges-Lehmann/Wilcoxon)."""
    centre: np.ndarray
    low: np.ndarray
    high: np.ndarray
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


def hodges_lehmann(d: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centre and `level` interval from the Walsh averages (d_i + d_j) / 2,
    i <= j: their median, and the order statistics the signed-rank
    distribution gives (Hollander & Wolfe, section 3.3)."""
    n = d.shape[-1]
    i, j = np.triu_indices(n)
    walsh = np.sort((d[..., i] + d[..., j]) / 2, axis=-1)
    centre = np.median(walsh, axis=-1)
    c = _order_index(_signed_rank_cdf(n), level)
    if c == 0:
        inf = np.full(centre.shape, np.inf)
        return centre, -inf, inf
    return centre, walsh[..., c - 1], walsh[..., walsh.shape[-1] - c]


def median_sign(d: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                       np.ndarray]:
    """Median, order-statistic interval (binomial) and two-sided sign test p."""
    n = d.shape[-1]
    s = np.sort(d, axis=-1)
    centre = np.median(d, axis=-1)
    c = _order_index(stats.binom.cdf(np.arange(n + 1), n, 0.5), level)
    if c == 0:
        low, high = np.full(centre.shape, -np.inf), np.full(centre.shape, np.inf)
    else:
        low, high = s[..., c - 1], s[..., n - c]
    pos, nonzero = (d > 0).sum(-1), (d != 0).sum(-1)
    p = np.minimum(1.0, 2 * np.minimum(stats.binom.cdf(pos, nonzero, 0.5),
                                       stats.binom.sf(pos - 1, nonzero, 0.5)))
    return centre, low, high, np.where(nonzero > 0, p, 1.0)


def paired(d: np.ndarray, level: float, outlier_z: float = 3.5) -> Paired:
    """Paired inference on log ratios `d` (rows: comparisons, columns: rounds)."""
    d = np.atleast_2d(np.asarray(d, dtype=float))
    outliers = modified_z(d) > outlier_z
    centre, low, high = hodges_lehmann(d, level)
    with np.errstate(invalid="ignore"):
        p = np.atleast_1d(stats.wilcoxon(d, axis=-1).pvalue)
    p = np.where(np.isfinite(p), p, 1.0)          # every ratio exactly 1
    sign = outliers.sum(-1) >= SIGN_TEST_OUTLIERS
    if sign.any():
        mc, ml, mh, mp = median_sign(d, level)
        centre, low, high, p = (np.where(sign, b, a) for a, b in
                                ((centre, mc), (low, ml), (high, mh), (p, mp)))
    return Paired(centre, low, high, p, sign, outliers)


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


# Outcomes of one look, before the metric's direction names them.
UNDECIDED, NO_CHANGE, HIGHER, LOWER = 0, 1, 2, 3


def decide(centre, low, high, p_adjusted, alpha: float, tolerance: float) -> np.ndarray:
    """The rule on log ratios, elementwise:
    NO_CHANGE  the whole interval lies inside [log(1-tol), log(1+tol)];
    HIGHER / LOWER  the adjusted p is below this look's alpha, the interval
               excludes 0 and the centre lies beyond the tolerance;
    UNDECIDED  otherwise."""
    up, down = math.log1p(tolerance), math.log1p(-tolerance)
    centre, low, high = (np.asarray(x, dtype=float) for x in (centre, low, high))
    with np.errstate(invalid="ignore"):
        inside = (low >= down) & (high <= up)
        sig = (np.asarray(p_adjusted, dtype=float) < alpha) & ((low > 0) | (high < 0))
        return np.where(inside, NO_CHANGE, np.where(sig & (centre > up), HIGHER,
                                                    np.where(sig & (centre < down), LOWER,
                                                             UNDECIDED)))


# ---------------------------------------------------------------- one comparison

@dataclass(frozen=True)
class Outlier:
    """A trial far outside its round's pattern: kept, and named."""
    round: int | None
    arm: str
    position: int | None       # planned position of the trial (0-based)
    factor: float              # its value / its arm's median

    def __str__(self) -> str:
        where = f"round {self.round} " if self.round is not None else ""
        pos = f" (trial {self.position})" if self.position is not None else ""
        return f"{where}{self.arm}{pos} x{self.factor:.2f} its arm's median"


@dataclass(frozen=True)
class Series:
    """One arm's observations of a metric: a value per trial (the median of
    its samples), with the trial's round and planned position when known."""
    values: tuple[float, ...]
    rounds: tuple[int, ...] | None = None
    positions: tuple[int, ...] | None = None

    @classmethod
    def of(cls, values, rounds=None, positions=None) -> Series:
        if isinstance(values, Series):
            return values
        keep = [i for i, v in enumerate(values) if v is not None and np.isfinite(v)]
        pick = (lambda xs: tuple(int(xs[i]) for i in keep) if xs is not None else None)
        return cls(tuple(float(values[i]) for i in keep), pick(rounds), pick(positions))

    def upto(self, rounds: int) -> Series:
        """The observations of the first `rounds` rounds."""
        if self.rounds is None:
            return self
        keep = [i for i, r in enumerate(self.rounds) if r < rounds]
        return Series(tuple(self.values[i] for i in keep), tuple(self.rounds[i] for i in keep),
                      tuple(self.positions[i] for i in keep) if self.positions else None)

    def by_round(self) -> dict[int, tuple[float, int | None]]:
        if self.rounds is None:
            return {}
        pos = self.positions or (None,) * len(self.values)
        return {r: (v, p) for r, v, p in zip(self.rounds, self.values, pos)}


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
    noisy: str                 # "" or which arm is noisier than max_cv
    outliers: tuple[Outlier, ...]
    problem: str = ""          # why there is no estimate

    @property
    def log(self) -> tuple[float, float, float]:
        return tuple(math.log(x) if x > 0 else float("nan")
                     for x in (self.ratio, self.ci_low, self.ci_high))


def estimate(arm: str, baseline: str, a: Series, b: Series, criteria: Criteria, look: int,
             seed: int = 1) -> Estimate:
    """Centre, interval (at this look's confidence) and p of arm / baseline."""
    sa, sb = summarize(a.values), summarize(b.values)
    level = criteria.confidence_at(look)
    nan = float("nan")
    noisy = ", ".join(f"{name} robust CV {cv:.1%}" for name, cv in ((arm, sa.rcv),
                                                                    (baseline, sb.rcv))
                      if np.isfinite(cv) and cv > criteria.max_cv)

    def make(method, n, nb, ratio, lo, hi, p, outliers=(), problem=""):
        return Estimate(method, n, nb, sa.median, sb.median, ratio, lo, hi, p, level, sa.cv,
                        sb.cv, sa.rcv, sb.rcv, noisy, tuple(outliers), problem)

    if sa.n < MIN_SAMPLES or sb.n < MIN_SAMPLES:
        return make("", sa.n, sb.n, nan, nan, nan, nan,
                    problem=f"too few samples ({sa.n} vs {sb.n}, need {MIN_SAMPLES})")
    if sb.median == 0:
        return make("", sa.n, sb.n, nan, nan, nan, nan, problem="baseline median is 0")
    ra, rb = a.by_round(), b.by_round()
    common = sorted(ra.keys() & rb.keys())
    positive = min(a.values) > 0 and min(b.values) > 0     # log ratios exist
    if len(common) >= MIN_PAIRS and positive:
        d = np.log([ra[r][0] / rb[r][0] for r in common])
        res = paired(d, level, criteria.outlier_z)
        named = [_culprit(r, arm, baseline, ra[r], rb[r], sa.median, sb.median)
                 for r, out in zip(common, res.outliers[0]) if out]
        return make("paired-sign" if res.sign[0] else "paired-wilcoxon", len(common),
                    len(common), *(math.exp(float(x[0])) for x in (res.centre, res.low,
                                                                   res.high)),
                    float(res.p[0]), named)
    x, y = np.asarray(a.values), np.asarray(b.values)
    lo, hi = _bootstrap_ci(x, y, level, seed, criteria.resamples)
    p = float(stats.mannwhitneyu(x, y, alternative="two-sided").pvalue)
    named = [Outlier(None, name, None, v / med)
             for name, vals, med in ((arm, x, sa.median), (baseline, y, sb.median))
             for v, z in zip(vals, modified_z(vals)) if z > criteria.outlier_z and med]
    return make("unpaired", sa.n, sb.n, sa.median / sb.median, lo, hi, p, named)


def _culprit(rnd: int, arm: str, baseline: str, a: tuple[float, int | None],
             b: tuple[float, int | None], med_a: float, med_b: float) -> Outlier:
    """Of the two trials of an outlying round, the one further from its arm's median."""
    fa, fb = a[0] / med_a, b[0] / med_b
    if abs(math.log(fa)) >= abs(math.log(fb)):
        return Outlier(rnd, arm, a[1], fa)
    return Outlier(rnd, baseline, b[1], fb)


def _ratio_of_medians(x, y, axis=-1):
    return np.median(x, axis=axis) / np.median(y, axis=axis)


def _bootstrap_ci(x: np.ndarray, y: np.ndarray, level: float, seed: int,
                  resamples: int) -> tuple[float, float]:
    """Percentile bootstrap CI of median(arm)/median(base), arms resampled
    independently (Efron & Tibshirani 1993, ch. 13)."""
    if np.all(x == x[0]) and np.all(y == y[0]):
        r = float(x[0] / y[0])
        return r, r
    with np.errstate(divide="ignore", invalid="ignore"):
        res = stats.bootstrap((x, y), _ratio_of_medians, n_resamples=resamples,
                              confidence_level=level, method="percentile", vectorized=True,
                              paired=False, rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


@dataclass(frozen=True)
class Comparison:
    metric: str
    arm: str
    baseline: str
    n: int
    n_baseline: int
    median: float
    median_baseline: float
    ratio: float           # paired: exp(centre of the per-round log ratios); else of medians
    ci_low: float
    ci_high: float
    p_value: float
    cv: float
    cv_baseline: float
    rcv: float
    rcv_baseline: float
    verdict: Verdict
    reason: str
    p_adjusted: float = float("nan")
    correction: str = ""       # e.g. "Holm over 4 tests"
    method: str = ""           # paired-wilcoxon, paired-sign, unpaired
    confidence: float = float("nan")   # the interval's level at the look that decided
    rounds: int = 0            # rounds the verdict rests on
    look: int = 0              # 1-based look that decided (or the last one judged)
    looks: int = 0             # planned looks
    stopped: str = ""          # why no more rounds were added
    noisy: str = ""            # "" or which arm's robust CV exceeds max_cv
    outliers: tuple[Outlier, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "verdict", Verdict(self.verdict))   # from JSON or a literal
        object.__setattr__(self, "outliers", tuple(
            o if isinstance(o, Outlier) else Outlier(**o) for o in self.outliers))

    @property
    def change(self) -> float:
        """The relative difference, +0.35 for 35 % higher than the baseline."""
        return self.ratio - 1

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def as_row(self) -> dict[str, object]:
        """Flat, for CSV: the outliers as one text field."""
        return {**self.as_dict(), "outliers": "; ".join(map(str, self.outliers))}


def verdict_of(outcome: int, higher_is_better: bool) -> Verdict:
    if outcome == NO_CHANGE:
        return Verdict.NO_CHANGE
    if outcome in (HIGHER, LOWER):
        return Verdict.IMPROVEMENT if (outcome == HIGHER) == higher_is_better \
            else Verdict.REGRESSION
    return Verdict.UNRELIABLE


METHOD_TEXT = {"paired-wilcoxon": "paired by round, Hodges-Lehmann / Wilcoxon signed-rank",
               "paired-sign": "paired by round, median / sign test (outlier rounds)",
               "unpaired": "unpaired, bootstrap / Mann-Whitney U"}


def judged(metric: str, arm: str, baseline: str, e: Estimate, p_adjusted: float,
           higher_is_better: bool, criteria: Criteria, look: int, rounds: int,
           correction: str) -> Comparison:
    """The verdict of one estimate at one look, with its reason."""
    tol = f"±{criteria.tolerance:.0%}"
    level = f"{e.confidence:.1%}"
    common = dict(p_adjusted=p_adjusted, correction=correction, method=e.method,
                  confidence=e.confidence, rounds=rounds, look=look + 1,
                  looks=len(criteria.looks()), noisy=e.noisy, outliers=e.outliers)

    def make(verdict: Verdict, reason: str) -> Comparison:
        return Comparison(metric, arm, baseline, e.n, e.n_baseline, e.median, e.median_baseline,
                          e.ratio, e.ci_low, e.ci_high, e.p_value, e.cv, e.cv_baseline, e.rcv,
                          e.rcv_baseline, verdict, reason, **common)

    if e.problem:
        return make(Verdict.UNRELIABLE, e.problem)
    if e.method == "unpaired" and e.noisy:
        return make(Verdict.UNRELIABLE, f"too noisy for the unpaired method: {e.noisy} > "
                                         f"{criteria.max_cv:.0%}")
    c, lo, hi = e.log
    outcome = int(decide(c, lo, hi, p_adjusted, criteria.alpha_at(look), criteria.tolerance))
    verdict = verdict_of(outcome, higher_is_better)
    noisy = f"; noisy: {e.noisy} > {criteria.max_cv:.0%}" if e.noisy else ""
    p_text = f"p = {e.p_value:.2g}" + (f" ({correction}: {p_adjusted:.2g})" if correction
                                      else "")
    alpha = f"alpha {criteria.alpha_at(look):.3g}"
    if outcome == NO_CHANGE:
        return make(verdict, f"{level} CI inside {tol}{noisy}")
    if outcome != UNDECIDED:
        return make(verdict, f"{p_text} < {alpha}, {e.ratio - 1:+.1%} beyond {tol}{noisy}")
    up, down = math.log1p(criteria.tolerance), math.log1p(-criteria.tolerance)
    excludes_1 = lo > 0 or hi < 0
    ci = f"{level} CI [{e.ci_low:.3f}, {e.ci_high:.3f}]"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        why = f"{e.n} rounds are too few for a {level} CI"
    elif excludes_1 and (c > up or c < down):
        why = f"{p_text} not below {alpha}"
    elif excludes_1:
        why = f"changed {e.ratio - 1:+.1%}, inside {tol}, but the {ci} reaches beyond it"
    else:
        why = f"{ci} straddles {tol}"
    return make(verdict, why + noisy)


def compare(metric: str, arm: str, baseline: str, values, base_values,
            higher_is_better: bool, criteria: Criteria = Criteria(), seed: int = 1) -> Comparison:
    """Judge one metric of one arm against its baseline on its own: a family
    of one test and a single look at all the rounds given (the whole alpha and
    confidence).  `values` and `base_values` are lists (unpaired) or Series
    with rounds (paired)."""
    a, b = Series.of(values), Series.of(base_values)
    rounds = max([*(a.rounds or ()), *(b.rounds or ()), -1]) + 1 or max(len(a.values),
                                                                        len(b.values))
    one = replace(criteria, min_rounds=max(rounds, 1), max_rounds=max(rounds, 1))
    e = estimate(arm, baseline, a, b, one, 0, seed)
    return judged(metric, arm, baseline, e, e.p_value, higher_is_better, one, 0, rounds, "")


def not_comparable(c: Comparison, reason: str) -> Comparison:
    """The same figures, judged not comparable by the state audit."""
    return replace(c, verdict=Verdict.NOT_COMPARABLE, reason=reason)
