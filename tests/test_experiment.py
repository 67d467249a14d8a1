"""Profiles and schedules: every shipped profile loads; bad ones fail with
file, line and key; the schedule is seeded, interleaved and reproducible."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from mmlab.errors import MmlabError
from mmlab.experiment.plan import baseline_for, load, parse, with_kernels
from mmlab.experiment.schedule import schedule, slots, williams

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"

GOOD = """\
name = "t"
workload = "pageout-refault"
repetitions = 3
metrics = ["cycle_ns_per_page"]
baseline = { thp = "nohugepage" }

[params]
mapping-kb = 1024

[matrix]
thp = ["hugepage", "nohugepage"]
"""


def test_schedule_is_interleaved_seeded_and_reproducible():
    arms = ["a", "b", "c"]
    order = schedule(arms, 5, seed=42)
    assert len(order) == 15
    for rnd in range(5):
        assert sorted(name for r, name in order if r == rnd) == arms   # each round: every arm once
    assert [r for r, _ in order] == sorted(r for r, _ in order)        # rounds never mix
    assert order == schedule(arms, 5, seed=42)
    others = [schedule(arms, 5, seed=s) for s in range(1, 6)]
    assert any(o != order for o in others)
    assert slots(order) == [0, 1, 2] * 5


def test_williams_designs_balance_position_and_the_arm_before():
    """Every treatment in every position equally often; every ordered pair of
    treatments adjacent equally often (once for even k, twice for odd k)."""
    for k in range(1, 10):
        rows = williams(k)
        assert len(rows) == (2 * k if k % 2 else k)
        assert all(sorted(row) == list(range(k)) for row in rows)
        assert len(set(Counter((row[i], i) for row in rows for i in range(k)).values())) == 1
        after = Counter((row[i - 1], row[i]) for row in rows for i in range(1, k))
        assert len(after) == k * (k - 1) and set(after.values()) <= {1 if k % 2 == 0 else 2}


@pytest.mark.parametrize("k", [2, 3, 4, 5, 6])
def test_every_block_of_rounds_is_balanced_for_every_seed(k):
    """In each block of rounds (k, or 2k for odd k) every arm is first equally
    often and follows every other arm equally often, whatever the seed; the
    first k rounds of an odd block balance the positions already.  A plan
    extended look by look is the plan drawn whole."""
    arms = [f"arm{i}" for i in range(k)]
    size = 2 * k if k % 2 else k
    for seed in range(100):
        order = schedule(arms, 2 * size, seed)
        rounds = [[name for r, name in order if r == rnd] for rnd in range(2 * size)]
        for block in (rounds[:size], rounds[size:], rounds[:k]):
            places = Counter((row[i], i) for row in block for i in range(k))
            assert set(places.values()) == {len(block) // k}
        after = Counter((row[i - 1], row[i]) for row in rounds[:size] for i in range(1, k))
        assert len(after) == k * (k - 1) and len(set(after.values())) == 1
        assert order == schedule(arms, size + 1, seed) + schedule(arms, 2 * size, seed,
                                                                  start=size + 1)
    assert len({tuple(schedule(arms, size, s)) for s in range(20)}) > 1    # seeds differ


@pytest.mark.parametrize("path", sorted(EXPERIMENTS.glob("*.toml")), ids=lambda p: p.name)
def test_shipped_profiles_load(path):
    plan = load(path)
    assert len(plan.order) == len(plan.arms) * plan.profile.repetitions
    if len(plan.arms) == 1:     # an A/B profile: `mmlab ab` adds the kernel axis
        plan = with_kernels(plan, ["build:a", "build:b"], "A/B")
    assert any(baseline_for(plan, a) is not None for a in plan.arms)


def test_required_profiles_are_shipped():
    names = {p.stem for p in EXPERIMENTS.glob("*.toml")}
    assert {"pageout-thp-modes", "pageout-swap", "mremap-workers-swap",
            "unmap-young-sequential", "ksm-rmap-vma-scaling", "aa-pageout"} <= names


def test_table_baseline_pairs_by_the_other_axes():
    plan = parse(GOOD.replace('thp = ["hugepage", "nohugepage"]',
                              'thp = ["hugepage", "nohugepage"]\nrounds = [1, 2]'))
    pairs = {a.name: baseline_for(plan, a) for a in plan.arms}
    assert pairs["thp=hugepage,rounds=2"].name == "thp=nohugepage,rounds=2"
    assert pairs["thp=nohugepage,rounds=1"] is None


def test_min_sample_ms_becomes_the_workload_parameter():
    plan = parse(GOOD + "", "p.toml")
    assert "min-ms" not in plan.arms[0].params
    plan = parse(GOOD.replace("repetitions = 3", "repetitions = 3\nmin_sample_ms = 50"))
    assert plan.arms[0].params["min-ms"] == 50


@pytest.mark.parametrize("change, message", [
    (("repetitions = 3", "repetitions = 3\ncolour = 1"), r"p\.toml:4: colour: unknown key"),
    (("repetitions = 3", 'repetitions = "three"'), r"p\.toml:3: repetitions: Input should be"),
    (("repetitions = 3", "repetitions = 2"), r"p\.toml:3: repetitions: 2: arms are compared from 3 rounds on"),
    (('thp = ["hugepage", "nohugepage"]', "thp = []"), r"p\.toml:11: matrix\.thp: List should have at least 1 item"),
    (('[matrix]\nthp = ["hugepage", "nohugepage"]\n', ""), r"p\.toml: matrix: give either"),
    (('["cycle_ns_per_page"]', '["cycle_ns"]'), r"p\.toml:4: metrics: unknown metric 'cycle_ns'"),
    (('baseline = { thp = "nohugepage" }', 'baseline = "nobody"'),
     r"p\.toml:5: baseline: no arm is named 'nobody'"),
    (('baseline = { thp = "nohugepage" }', 'baseline = { thp = "always" }'),
     r"p\.toml:5: baseline\.thp: 'always' is not a value"),
    (('thp = ["hugepage", "nohugepage"]', 'thp = ["hugepage", "sometimes"]'),
     r"p\.toml:10: matrix: pageout-refault: --thp: 'sometimes' is not one of"),
    (('thp = ["hugepage", "nohugepage"]', 'thp = ["hugepage", "nohugepage"]\nswap = ["lots"]'),
     r"p\.toml:12: matrix\.swap: 'lots': expected none, file:SIZE or zram:SIZE"),
    (('thp = ["hugepage", "nohugepage"]', 'thp = ["hugepage", "nohugepage"]\n"ksm.run" = ["on"]'),
     r"p\.toml:12: matrix\.ksm\.run: 'on': Input should be a valid integer"),
    (("mapping-kb = 1024", "mapping-kb = 1024\nflavour = 3"),
     r"matrix: pageout-refault: unknown parameter 'flavour'"),
    (('workload = "pageout-refault"', 'workload = "nope"'), r"p\.toml:2: workload: unknown workload"),
    (("repetitions = 3", "repetitions = = 3"), r"p\.toml: Invalid value .*line 3"),
])
def test_bad_profiles_name_file_line_and_key(change, message):
    old, new = change
    assert old in GOOD
    with pytest.raises(MmlabError, match=message):
        parse(GOOD.replace(old, new, 1), "p.toml")


def test_missing_profile_file_is_named(tmp_path):
    with pytest.raises(MmlabError, match="nope.toml: no such profile"):
        load(tmp_path / "nope.toml")


def test_a_family_too_large_for_its_rounds_is_warned_of():
    """5 rounds give p >= 2/252 unpaired; Holm over 8 tests needs p < 0.05/8."""
    plan = load(EXPERIMENTS / "seed000-zero-pages-swapout.toml")
    assert plan.tests() == 8
    assert "Holm over its 8 tests needs one below 0.00625" in plan.warnings()[0]


def test_three_samples_per_arm_can_never_be_significant():
    plan = parse(GOOD, "p.toml")                 # repetitions = 3
    assert plan.smallest_p() == 0.1
    assert "can show 'no change' but never" in plan.warnings()[0]
    four = parse(GOOD.replace("repetitions = 3", "repetitions = 4"), "p.toml")
    assert four.smallest_p() == pytest.approx(2 / 70) and four.warnings() == []
