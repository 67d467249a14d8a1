"""One comparison's verdict: an estimate at a look judged by the criteria
(`of_estimate`), with the reason a person reads, as the record every report
and table shows.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from mmlab.judge.criteria import NO_CHANGE, UNDECIDED, Criteria, Verdict, outcomes, verdict_of
from mmlab.judge.order import OrderEffect
from mmlab.judge.stats import Estimate, Outlier


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
    beside: str = ""           # machine-wide state a neighbour beside the trials may explain
    outliers: tuple[Outlier, ...] = field(default_factory=tuple)
    order_effects: tuple[OrderEffect, ...] = field(default_factory=tuple)   # found in the run

    def __post_init__(self) -> None:
        object.__setattr__(self, "verdict", Verdict(self.verdict))   # from JSON or a literal
        object.__setattr__(self, "outliers", tuple(
            o if isinstance(o, Outlier) else Outlier(**o) for o in self.outliers))
        object.__setattr__(self, "order_effects", tuple(
            o if isinstance(o, OrderEffect) else OrderEffect(**o) for o in self.order_effects))

    @property
    def change(self) -> float:
        """The relative difference, +0.35 for 35 % higher than the baseline."""
        return self.ratio - 1

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def as_row(self) -> dict[str, object]:
        """Flat, for CSV: the outliers and the order effects as text fields."""
        return {**self.as_dict(), "outliers": "; ".join(map(str, self.outliers)),
                "order_effects": "; ".join(map(str, self.order_effects))}


METHOD_TEXT = {"paired-wilcoxon": "paired by round, Hodges-Lehmann / Wilcoxon signed-rank",
               "paired-sign": "paired by round, median / sign test (outlier rounds)",
               "unpaired": "unpaired, bootstrap / Mann-Whitney U"}



def of_estimate(metric: str, arm: str, baseline: str, e: Estimate, p_adjusted: float,
           higher_is_better: bool, criteria: Criteria, look: int, rounds: int,
           correction: str) -> Comparison:
    """The verdict of one estimate at one look, with its reason."""
    tol = f"±{criteria.tolerance:.0%}"
    level = f"{e.confidence:.1%}"

    def make(verdict: Verdict, reason: str) -> Comparison:
        return Comparison(metric, arm, baseline, e.n, e.n_baseline, e.median, e.median_baseline,
                          e.ratio, e.ci_low, e.ci_high, e.p_value, e.cv, e.cv_baseline, e.rcv,
                          e.rcv_baseline, verdict, reason, p_adjusted=p_adjusted,
                          correction=correction, method=e.method, confidence=e.confidence,
                          rounds=rounds, look=look + 1, looks=len(criteria.looks()),
                          noisy=e.noisy, outliers=e.outliers)

    if e.problem:
        return make(Verdict.UNRELIABLE, e.problem)
    if e.method == "unpaired" and e.noisy:
        return make(Verdict.UNRELIABLE, f"too noisy for the unpaired method: {e.noisy} > "
                                         f"{criteria.max_cv:.0%}")
    c, lo, hi, mlo, mhi = e.log
    outcome = int(outcomes(lo, hi, mlo, mhi, p_adjusted, criteria.alpha_at(look),
                           criteria.tolerance))
    verdict = verdict_of(outcome, higher_is_better)
    noisy = f"; noisy: {e.noisy} > {criteria.max_cv:.0%}" if e.noisy else ""
    p_text = f"p = {e.p_value:.2g}" + (f" ({correction}: {p_adjusted:.2g})" if correction
                                      else "")
    alpha = f"alpha {criteria.alpha_at(look):.3g}"
    up, down = math.log1p(criteria.tolerance), math.log1p(-criteria.tolerance)
    one_sided = f"one-sided {(1 + criteria.margin_at(look)) / 2:.1%} bound"
    bound = e.margin_low if c > 0 else e.margin_high
    if outcome == NO_CHANGE:
        return make(verdict, f"{level} CI inside {tol}{noisy}")
    if outcome != UNDECIDED:
        return make(verdict, f"{p_text} < {alpha}, {e.ratio - 1:+.1%} beyond {tol} "
                             f"({one_sided} {bound:.3f}){noisy}")
    excludes_1 = lo > 0 or hi < 0
    ci = f"{level} CI [{e.ci_low:.3f}, {e.ci_high:.3f}]"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        why = f"{e.n} rounds are too few for a {level} CI"
    elif excludes_1 and (c > up or c < down) and not p_adjusted < criteria.alpha_at(look):
        why = f"{p_text} not below {alpha}"
    elif excludes_1 and (c > up or c < down):
        why = (f"changed {e.ratio - 1:+.1%}, but its {one_sided} {bound:.3f} lies inside "
               f"{tol}: not shown to exceed it")
    elif excludes_1:
        why = f"changed {e.ratio - 1:+.1%}, inside {tol}, but the {ci} reaches beyond it"
    else:
        why = f"{ci} straddles {tol}"
    return make(verdict, why + noisy)


def not_comparable(c: Comparison, reason: str) -> Comparison:
    """The same figures, judged not comparable by the state audit."""
    return replace(c, verdict=Verdict.NOT_COMPARABLE, reason=reason)
