"""Summaries of samples and comparisons between arms.

Medians rather than means throughout: mm timings have long right tails
(reclaim, compaction and lock waits strike some samples and not others), and
the median with a bootstrap interval is robust to them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats


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


def summarize(values: list[float]) -> Summary:
    """The per-arm statistics of one metric; NaN where undefined (n < 2)."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
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


MIN_SAMPLES = 3
VERDICTS = ("regression", "improvement", "no change", "unreliable", "not comparable")


@dataclass(frozen=True)
class Comparison:
    metric: str
    arm: str
    baseline: str
    n: int
    n_baseline: int
    median: float
    median_baseline: float
    ratio: float           # median(arm) / median(baseline)
    ci_low: float
    ci_high: float
    p_value: float
    cv: float
    cv_baseline: float
    rcv: float
    rcv_baseline: float
    verdict: str
    reason: str

    @property
    def change(self) -> float:
        """The relative difference, +0.35 for 35 % higher than the baseline."""
        return self.ratio - 1

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _ratio_of_medians(a, b, axis=-1):
    return np.median(a, axis=axis) / np.median(b, axis=axis)


def ratio_ci(arm: np.ndarray, base: np.ndarray, seed: int,
             confidence: float = 0.95, resamples: int = 4999) -> tuple[float, float]:
    """Percentile bootstrap CI of median(arm)/median(base), arms resampled
    independently (Efron & Tibshirani 1993, ch. 13)."""
    if np.all(arm == arm[0]) and np.all(base == base[0]):
        r = float(arm[0] / base[0])
        return r, r
    res = stats.bootstrap((arm, base), _ratio_of_medians, n_resamples=resamples,
                          confidence_level=confidence, method="percentile", vectorized=True,
                          paired=False, rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def compare(metric: str, arm: str, baseline: str, values: list[float], base_values: list[float],
            higher_is_better: bool, tolerance: float, max_cv: float, alpha: float = 0.05,
            seed: int = 1) -> Comparison:
    """Judge one metric of one arm against its baseline.

    The verdict needs both the interval and the test to agree:
      - no change:    the whole CI of the ratio lies inside 1 +- tolerance;
      - regression / improvement: the whole CI lies outside it on one side
        and Mann-Whitney U (two-sided) gives p < alpha;
      - unreliable:   too few samples, a robust CV above max_cv, a CI that
        straddles the tolerance boundary, or a CI outside it without a
        significant test.
    The noise gate uses the robust CV (1.4826 MAD / median): one round
    disturbed by the machine would blow up the classic CV of every arm, while
    interleaving has already spread that round over all arms alike.
    """
    a = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    b = np.asarray([v for v in base_values if v is not None and np.isfinite(v)], dtype=float)
    sa, sb = summarize(list(a)), summarize(list(b))
    nan = float("nan")

    def result(ratio, lo, hi, p, verdict, reason) -> Comparison:
        return Comparison(metric, arm, baseline, sa.n, sb.n, sa.median, sb.median, ratio, lo, hi,
                          p, sa.cv, sb.cv, sa.rcv, sb.rcv, verdict, reason)

    if sa.n < MIN_SAMPLES or sb.n < MIN_SAMPLES:
        return result(nan, nan, nan, nan, "unreliable",
                      f"too few samples ({sa.n} vs {sb.n}, need {MIN_SAMPLES})")
    if sb.median == 0:
        return result(nan, nan, nan, nan, "unreliable", "baseline median is 0")
    ratio = sa.median / sb.median
    lo, hi = ratio_ci(a, b, seed)
    p = float(stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)
    noisy = [f"{name} robust CV {cv:.1%}" for name, cv in ((arm, sa.rcv), (baseline, sb.rcv))
             if np.isfinite(cv) and cv > max_cv]
    if noisy:
        return result(ratio, lo, hi, p, "unreliable",
                      f"too noisy: {', '.join(noisy)} > {max_cv:.0%}")
    band_lo, band_hi = 1 - tolerance, 1 + tolerance
    if band_lo <= lo and hi <= band_hi:
        return result(ratio, lo, hi, p, "no change",
                      f"95% CI inside ±{tolerance:.0%}")
    if lo > band_hi or hi < band_lo:
        if p >= alpha:
            return result(ratio, lo, hi, p, "unreliable",
                          f"CI outside ±{tolerance:.0%} but p = {p:.3g} >= {alpha}")
        worse = (lo > band_hi) != higher_is_better
        return result(ratio, lo, hi, p, "regression" if worse else "improvement",
                      f"95% CI beyond ±{tolerance:.0%}, p = {p:.3g}")
    return result(ratio, lo, hi, p, "unreliable",
                  f"95% CI [{lo:.3f}, {hi:.3f}] straddles ±{tolerance:.0%}")


def not_comparable(c: Comparison, reason: str) -> Comparison:
    """The same figures, judged not comparable by the state audit."""
    return Comparison(**{**c.as_dict(), "verdict": "not comparable", "reason": reason})
