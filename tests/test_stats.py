"""Statistics against values known by hand or by scipy, and the operating
characteristics of the verdicts measured by simulation (fixed seeds)."""

import math
import time

import numpy as np
import pytest
from scipy import stats as sps

from mmlab.judge import criteria, selftest, stats
from mmlab.judge.criteria import Criteria
from mmlab.judge.stats import summarize


def test_summary_of_known_values():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (s.n, s.median, s.min, s.max) == (5, 3.0, 1.0, 100.0)
    assert s.mean == pytest.approx(22.0)
    assert s.mad == 1.0                               # |x - 3| = 2,1,0,1,97
    assert s.stdev == pytest.approx(43.6176, rel=1e-4)
    assert s.cv == pytest.approx(43.6176 / 22.0, rel=1e-4)


def test_missing_values_are_dropped_and_empty_is_nan():
    assert summarize([None, 2.0, float("nan"), 4.0]).n == 2
    assert math.isnan(summarize([]).median)
    assert math.isnan(summarize([5.0]).cv)


def test_hodges_lehmann_interval_uses_the_tabled_critical_value():
    """n = 10, 95 %: the signed-rank table's lower critical value is 8, so the
    interval is [W_(9), W_(47)] of the 55 Walsh averages (Hollander & Wolfe)."""
    d = np.array([0.3, -0.1, 0.7, 1.2, 0.05, 0.4, -0.6, 0.9, 0.25, 1.5])
    walsh = np.sort([(d[i] + d[j]) / 2 for i in range(10) for j in range(i, 10)])
    centre, low, high = stats.hodges_lehmann(d[None, :], 0.95)
    assert (low[0], high[0]) == (walsh[8], walsh[46])
    assert centre[0] == np.median(walsh)
    assert stats._order_index(stats._signed_rank_cdf(5), 0.95) == 0    # 5 pairs: no 95% CI


def test_paired_p_is_wilcoxon_or_sign_test_as_scipy_computes_them():
    rng = np.random.default_rng(4)
    d = rng.normal(0.02, 0.03, (5, 14))
    res = stats.paired(d, 0.9)
    assert not res.sign.any()
    assert res.p == pytest.approx([sps.wilcoxon(row).pvalue for row in d])
    d[:, :3] += 0.5                                   # three gross outlier rounds in each row
    res = stats.paired(d, 0.9)
    assert res.sign.all() and res.outliers[:, :3].all()
    assert res.p == pytest.approx([sps.binomtest(int((row > 0).sum()), 14).pvalue for row in d])
    assert np.all(res.centre == np.median(d, axis=1))


def test_holm_adjusts_step_down_and_ignores_missing_tests():
    adj = stats.holm(np.array([0.01, 0.04, 0.03, np.nan]))
    assert adj[:3] == pytest.approx([0.03, 0.06, 0.06])     # x3, x1 (monotone), x2
    assert math.isnan(adj[3])
    assert stats.adjust(np.array([0.01, 0.04]), "none") == pytest.approx([0.01, 0.04])


def test_looks_split_both_budgets_exactly():
    c = Criteria()
    assert c.looks() == (12, 18, 25)
    assert sum(c.alpha_at(k) for k in range(3)) == pytest.approx(c.alpha)
    assert sum(1 - c.confidence_at(k) for k in range(3)) == pytest.approx(1 - c.confidence)
    assert c.alpha_at(0) < c.alpha_at(2) and c.confidence_at(0) > c.confidence_at(2)
    assert c.next_look(12) == 18 and c.next_look(25) is None
    fixed = Criteria(min_rounds=9, max_rounds=9)
    assert fixed.looks() == (9,) and fixed.alpha_at(0) == 0.05 and fixed.confidence_at(0) == 0.9
    assert Criteria(min_rounds=8, max_rounds=40).looks() == (8, 12, 18, 27, 40)


def test_the_decision_rule_on_log_ratios():
    up = math.log(1.05)
    d = criteria.outcomes(np.array([0.0, 0.2, -0.2, 0.2, 0.03]),
                     np.array([-0.01, 0.1, -0.3, 0.1, 0.01]),
                     np.array([0.01, 0.3, -0.1, 0.3, 0.06]),
                     np.array([0.5, 0.001, 0.001, 0.2, 0.001]), 0.01, 0.05)
    assert list(d) == [criteria.NO_CHANGE, criteria.HIGHER, criteria.LOWER, criteria.UNDECIDED,
                       criteria.UNDECIDED]           # last: significant but centre inside 5%
    assert up > 0.03


def test_comparison_seeds_differ_per_comparison_and_repeat():
    a = stats.comparison_seed(1, "m", "A", "B")
    assert a == stats.comparison_seed(1, "m", "A", "B")
    assert len({a, stats.comparison_seed(1, "m", "C", "B"), stats.comparison_seed(2, "m", "A", "B"),
                stats.comparison_seed(1, "n", "A", "B")}) == 4


# ---------------------------------------------------------------- operating characteristics

@pytest.fixture(scope="module")
def operating_characteristics():
    start = time.monotonic()
    cells = selftest.run(Criteria(), experiments=1500, seed=2024)
    return cells, time.monotonic() - start


def test_the_verdicts_meet_the_issue_targets_at_the_defaults(operating_characteristics):
    """Family false alarms <= 2 %, A/A "no change" >= 90 %, a 10 % change found
    >= 95 % of the time under every noise model, within 25 rounds."""
    cells, seconds = operating_characteristics
    assert selftest.Targets().missed(cells, Criteria()) == []
    assert seconds < 30
    for c in cells:
        assert c.rounds <= 25
        if c.effect != 1:
            assert c.wrong_way <= 0.001             # a change is never put the wrong way


def test_a_change_at_the_tolerance_is_rarely_called_no_change(operating_characteristics):
    """The interval is a two one-sided tests' interval: at a true change equal to
    the tolerance "no change" comes at most (1 - confidence) / 2 = 5 % of the time."""
    cells, _ = operating_characteristics
    for c in (c for c in cells if c.effect == 1.05):
        assert c.no_change <= 0.06, c


def test_easy_cases_stop_early_and_hard_ones_use_more_rounds(operating_characteristics):
    cells, _ = operating_characteristics
    by = {(c.noise, c.effect): c for c in cells}
    assert by[("DRIFT", 1.10)].rounds == 12           # pairing removes the shared drift
    assert by[("LN5", 1.0)].rounds > 20               # 5 % noise against 5 % tolerance


def test_without_the_correction_the_family_needs_it():
    """The simulation can see what the correction is for: with many tests and a
    loose rule, uncorrected looks raise more alarms than Holm's."""
    loose = Criteria(tolerance=0.001, min_rounds=12, max_rounds=12)
    noise = selftest.NOISES[0]
    holm = selftest.simulate(noise, 1.0, loose, 3000, seed=1)
    none = selftest.simulate(noise, 1.0, Criteria(**{**loose.__dict__, "correction": "none"}),
                             3000, seed=1)
    assert holm.family_alarms <= loose.alpha + 0.01      # 0.01: about 2.5 Monte Carlo SEs
    assert none.family_alarms > 2 * loose.alpha
