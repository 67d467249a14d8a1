"""Summaries against values whose statistics are known by hand."""

import math

import pytest

from mmlab.stats import summarize


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
