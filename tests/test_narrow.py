"""The narrowing search on recorded verdicts: few comparisons, the right step."""

from __future__ import annotations

import math

import pytest

from mmlab import experiment, narrow
from mmlab.errors import MmlabError
from mmlab.stats import Comparison


def verdict(v: str, ratio: float = 1.0, lo: float = math.nan, hi: float = math.nan) -> Comparison:
    nan = math.nan
    return Comparison("m_ns", "b", "a", 9, 9, nan, nan, ratio, lo, hi, nan, nan, nan, nan, nan,
                      v, "recorded")


def recorded(first_changed: int | None, n: int):
    calls = []

    def compare(ref: str, kernel: str) -> Comparison:
        calls.append(kernel)
        i = int(kernel[1:])
        return verdict("regression" if first_changed is not None and i >= first_changed
                       else "no change")
    return compare, calls


@pytest.mark.parametrize("n, first", [(2, 1), (8, 1), (8, 5), (8, 7), (16, 9), (33, 20)])
def test_the_first_changed_kernel_is_found_in_log2_steps(n, first):
    kernels = [f"k{i}" for i in range(n)]
    compare, calls = recorded(first, n)
    result = narrow.bisect(kernels, compare)
    assert result.first_changed == first
    assert len(calls) <= 1 + math.ceil(math.log2(n - 1)) if n > 2 else len(calls) == 1
    assert result.sentence(kernels) == f"regression introduced between k{first - 1} and k{first}"


def test_nothing_changed_costs_one_comparison():
    kernels = [f"k{i}" for i in range(10)]
    compare, calls = recorded(None, 10)
    result = narrow.bisect(kernels, compare)
    assert result.first_changed is None and calls == ["k9"]
    assert "no change" in result.sentence(kernels)


def test_an_unplaceable_step_stops_the_search_with_a_reason():
    with pytest.raises(MmlabError, match="b vs a is unreliable"):
        narrow.bisect(["k0", "k1", "k2", "k3"], lambda ref, k: verdict("unreliable"))
    with pytest.raises(MmlabError, match="b vs a is not comparable"):
        narrow.bisect(["k0", "k1"], lambda ref, k: verdict("not comparable"))
    with pytest.raises(MmlabError, match="at least two kernels"):
        narrow.bisect(["k0"], lambda ref, k: verdict("no change"))


def test_a_change_in_any_group_decides():
    cs = [verdict("no change"), verdict("regression"), verdict("unreliable")]
    assert narrow.decisive(cs, "m_ns").verdict == "regression"
    assert narrow.decisive(cs[::2], "m_ns").verdict == "unreliable"


def test_derived_profiles_round_trip_through_toml():
    plan = experiment.load("experiments/pageout-thp-modes.toml")
    derived = experiment.with_kernels(plan, ["debian:6.1", "debian:6.12"], "narrow")
    assert derived.profile.baseline == {"kernel": "debian:6.1"}
    assert len(derived.arms) == 6 and derived.profile.focus == "do_madvise"
    again = experiment.parse(derived.text, derived.path)
    assert [a.name for a in again.arms] == [a.name for a in derived.arms]


def test_a_noisy_step_is_placed_by_the_side_of_the_break_its_ci_is_on():
    """End to end the metric fell to 0.076; a step at 0.999 [0.92, 1.10] is
    too noisy for 'no change' within 10 % but plainly on the old side."""
    recorded = {"k1": verdict("unreliable", 0.999, 0.924, 1.103),
                "k2": verdict("improvement", 0.076, 0.038, 0.078)}
    result = narrow.bisect(["k0", "k1", "k2"], lambda ref, k: recorded[k])
    assert result.first_changed == 2
    assert "old side of 0.276" in result.steps[1].why
    across = {"k1": verdict("unreliable", 0.3, 0.1, 0.9), "k2": recorded["k2"]}
    with pytest.raises(MmlabError, match="is unreliable"):
        narrow.bisect(["k0", "k1", "k2"], lambda ref, k: across[k])
