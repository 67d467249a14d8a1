"""Statistics against known distributions, and the same-state audit on
hand-built samples whose states are known."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from mmlab import audit, stats
from mmlab.samples import Sample


def draws(center: float, cv: float, n: int, seed: int) -> list[float]:
    return list(np.random.default_rng(seed).normal(center, center * cv, n))


def judge(a, b, higher=False, tol=0.05, max_cv=0.10):
    return stats.compare("m_ns", "A", "B", a, b, higher, tol, max_cv, seed=3)


def test_a_30_percent_slowdown_is_a_regression_with_a_ci_around_it():
    c = judge(draws(130, 0.02, 15, 1), draws(100, 0.02, 15, 2))
    assert c.verdict == "regression"
    assert c.ci_low < 1.3 < c.ci_high and c.ci_low > 1.05
    assert c.p_value < 1e-4
    assert judge(draws(130, 0.02, 15, 1), draws(100, 0.02, 15, 2), higher=True).verdict \
        == "improvement"


def test_the_same_distribution_is_no_change():
    c = judge(draws(100, 0.01, 15, 5), draws(100, 0.01, 15, 6))
    assert c.verdict == "no change" and 0.95 < c.ci_low <= c.ci_high < 1.05


def test_unreliable_when_noisy_small_or_ambiguous():
    assert judge(draws(100, 0.4, 15, 7), draws(100, 0.4, 15, 8)).verdict == "unreliable"
    assert "too few samples" in judge([1.0, 2.0], [1.0, 2.0, 3.0]).reason
    c = judge(draws(105, 0.02, 9, 9), draws(100, 0.02, 9, 10))   # 5 % change, 5 % tolerance
    assert c.verdict == "unreliable" and "straddles" in c.reason


def test_p_value_is_mann_whitney_and_ci_is_reproducible():
    a, b = draws(110, 0.03, 11, 11), draws(100, 0.03, 11, 12)
    c1, c2 = judge(a, b), judge(a, b)
    assert (c1.ci_low, c1.ci_high) == (c2.ci_low, c2.ci_high)
    assert c1.p_value == pytest.approx(sps.mannwhitneyu(a, b, alternative="two-sided").pvalue)


def test_one_disturbed_round_does_not_make_an_arm_noisy():
    calm = draws(100, 0.01, 9, 13)
    assert stats.summarize(calm + [130.0]).rcv < 0.03 < stats.summarize(calm + [130.0]).cv


def sample(state: dict | None = None, vmstat: dict | None = None, errors: dict | None = None,
           metric: float = 1.0) -> Sample:
    return Sample(workload="w", sample=0, mmwork_version="t", params={}, metrics={"m_ns": metric},
                  counts={}, rusage=dict.fromkeys(("user_s", "sys_s", "minflt", "majflt",
                                                   "nvcsw", "nivcsw"), 0.0),
                  vmstat_delta=vmstat or {}, state={"kernel": "6.18", **(state or {})},
                  errors=errors or {})


def test_different_thp_backing_is_not_comparable_unless_asked_for():
    thp = [sample({"thp_backed_fraction": 1.0}, {"thp_fault_alloc": 8}) for _ in range(3)]
    small = [sample({"thp_backed_fraction": 0.0}, {"thp_fault_alloc": 0}) for _ in range(3)]
    found = audit.audit_pair("A", "B", thp, small, differing_axes=set())
    assert {f.check for f in found} == {"THP backing of the mapping",
                                        "THP faults, splits and swap-out fallbacks"}
    assert "thp_backed_fraction 1 in A vs 0 in B" in str(found[0])
    assert audit.audit_pair("A", "B", thp, small, differing_axes={"thp"}) == []


def test_swap_in_use_on_one_side_only_is_found():
    used = [sample({"swap_total_kb": 65536, "swap_used_kb": 1000}) for _ in range(3)]
    none = [sample({"swap_total_kb": 0, "swap_used_kb": 0}) for _ in range(3)]
    checks = {f.check for f in audit.audit_pair("A", "B", used, none, set())}
    assert checks == {"swap configured", "swap used"}
    assert audit.audit_pair("A", "B", used, none, {"swap"}) == []


def test_mixed_state_within_an_arm_and_errors_are_flagged():
    mixed = [sample({"thp_backed_fraction": f}) for f in (1.0, 0.0, 1.0)]
    (f,) = audit.audit_arm("A", mixed)
    assert "varied within arm A: 0..1" in f.detail
    failing = [sample(errors={"madvise_pageout:EINVAL": 2}) for _ in range(2)]
    assert "madvise_pageout:EINVAL x4" in str(audit.audit_arm("B", failing)[0])
    steady = [sample({"thp_backed_fraction": 1.0, "swap_used_kb": v}) for v in (10, 5000, 90)]
    assert audit.audit_arm("C", steady) == []   # how much swap is used may vary


def test_a_ksm_walk_that_migrated_nothing_is_a_different_state():
    moved = [sample() for _ in range(3)]
    for s, n in zip(moved, (2.0, 0.0, 2.0)):
        s.counts["ksm_pages_migrated"] = n
    (f,) = audit.audit_arm("A", moved)
    assert f.check == "KSM pages compaction moved"
    assert f.matters_for("walk_trigger_ms")
    assert not f.matters_for("ms_per_migrated_page")   # already per migrated page
