"""The change-point simulation's goals are judged against its sampling
error: a simulated rate is a sample of the method's true rate, so a goal is
missed only when the rate is past it by more than that sample's error."""

import math

from typer.testing import CliRunner

from mmlab.track import simulate
from mmlab.track.simulate import ChangePointGoals, Rates

CASES = {c.name: c for c in simulate.CASES}
STEP = CASES["2% step in counts, 0.3% noise"]       # goal: found in >= 99 %
AA = CASES["A/A, times, 5% noise"]                  # goals: <= 5 % candidates, <= 1 % false


def found(share: float, series: int) -> Rates:
    return Rates(STEP, series, math.nan, 1.0, 0.0, share, 1.0, 6.0)


def aa(candidates: float, false: float, series: int) -> Rates:
    return Rates(AA, series, candidates, candidates, false, math.nan, 0.1, 20.0)


def test_a_rate_within_its_sampling_error_of_the_goal_is_not_missed():
    """98.9% of 2,000 series (the step's 99.06% over 10,000, seen at
    2,000): its one-sided 95% bound is 99.3%, so the goal is not missed."""
    goals = ChangePointGoals()
    near = [found(0.989, 2000), aa(0.055, 0.011, 2000)]
    assert goals.missed(near) == []
    said = goals.unsure(near)
    assert len(said) == 3
    assert said[0] == ("2% step in counts, 0.3% noise: found in 98.9% < 99% "
                        "(98.4%..99.3% over 2000 series)")
    assert goals.summary(near).startswith("met (within sampling error")


def test_a_rate_past_the_goal_beyond_its_sampling_error_is_missed():
    """The same shares over more series, or further off, are misses."""
    goals = ChangePointGoals()
    assert goals.missed([found(0.975, 2000)]) == [
        "2% step in counts, 0.3% noise: found in 97.5% < 99% (96.8%..98.0% over 2000 series)"]
    assert len(goals.missed([found(0.985, 10_000)])) == 1
    assert [m.split(":")[1] for m in goals.missed([aa(0.055, 0.011, 40_000)])] == [
        " candidates in 5.5% > 5% (5.3%..5.7% over 40000 series)",
        " false changes in 1.1% > 1% (1.0%..1.2% over 40000 series)"]
    assert goals.summary([found(0.95, 2000)]).startswith("MISSED: ")
    assert goals.missed([found(1.0, 300), aa(0.0, 0.0, 300)]) == []
    assert goals.unsure([found(0.99, 300), aa(0.05, 0.01, 300)]) == []


def test_rate_bounds_are_exact_at_the_ends():
    assert simulate.rate_bounds(0.0, 100)[0] == 0.0
    assert simulate.rate_bounds(1.0, 100)[1] == 1.0
    low, high = simulate.rate_bounds(0.0, 100)
    assert math.isclose(high, 1 - 0.05 ** (1 / 100))     # the rule of three's exact form


def test_selftest_changepoints_exits_by_the_goals(monkeypatch):
    """The command exits 0 when a goal is within sampling error (and says
    so), 1 when one is missed beyond it."""
    from mmlab.cli import app
    monkeypatch.setattr(simulate, "simulate_all", lambda series, seed: [found(0.989, series)])
    ran = CliRunner().invoke(app, ["selftest", "changepoints", "--series", "2000"])
    assert ran.exit_code == 0, ran.output
    assert "goals: met (within sampling error, more series decide: 2% step" in ran.output
    monkeypatch.setattr(simulate, "simulate_all", lambda series, seed: [found(0.96, series)])
    ran = CliRunner().invoke(app, ["selftest", "changepoints", "--series", "2000"])
    assert ran.exit_code == 1, ran.output
    assert "goals: MISSED: 2% step in counts, 0.3% noise: found in 96.0% < 99%" in ran.output
