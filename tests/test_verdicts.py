"""Statistics against known distributions, and the same-state audit on
hand-built samples whose states are known."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
from scipy import stats as sps

from mmlab.experiment.plan import Plan, parse
from mmlab.judge import audit, comparison, criteria, stats, verdicts
from mmlab.judge.measurements import Observations
from mmlab.run import runner
from mmlab.store import Store
from mmlab.workloads.samples import Sample

from .fake_target import FakeTarget, fake_pool


def draws(center: float, cv: float, n: int, seed: int) -> list[float]:
    return list(np.random.default_rng(seed).normal(center, center * cv, n))


def rounds(values: list[float]) -> Observations:
    """Values of rounds 0, 1, ... (positions 2r and 2r + 1 of a two-arm plan)."""
    return Observations(tuple(values), tuple(range(len(values))),
                        tuple(2 * r for r in range(len(values))))


CRIT = criteria.Criteria(min_rounds=15, max_rounds=15)      # one look: alpha 0.05, 90% CI


def judge(a, b, higher=False, crit=CRIT):
    """One metric of arm A against B at one look of all the rounds given, a
    family of one: the estimate and the verdict rule the runner uses."""
    a, b = (x if isinstance(x, Observations) else Observations.of(x) for x in (a, b))
    n = max([*(a.rounds or ()), *(b.rounds or ()), -1]) + 1 or max(len(a.values), len(b.values))
    one = dataclasses.replace(crit, min_rounds=max(n, 1), max_rounds=max(n, 1))
    e = stats.estimate("A", "B", a, b, one, 0)
    return comparison.of_estimate("m_ns", "A", "B", e, e.p_value, higher, one, 0, n, "")


def drifting(n: int, seed: int, shared: float = 0.06, own: float = 0.01,
             effect: float = 1.0) -> tuple[list[float], list[float]]:
    """Two arms sharing a per-round factor: what interleaving is for."""
    rng = np.random.default_rng(seed)
    drift = rng.lognormal(0, shared, n)
    return (list(100 * effect * drift * rng.lognormal(0, own, n)),
            list(100 * drift * rng.lognormal(0, own, n)))


def test_a_30_percent_slowdown_is_a_regression_with_a_ci_around_it():
    a, b = draws(130, 0.02, 15, 1), draws(100, 0.02, 15, 2)
    c = judge(rounds(a), rounds(b))
    assert c.verdict == "regression" and c.method == "paired-wilcoxon"
    assert c.ci_low < 1.3 < c.ci_high and c.ci_low > 1.05
    assert c.p_value == pytest.approx(sps.wilcoxon(np.log(np.array(a) / b)).pvalue)
    assert judge(rounds(a), rounds(b), higher=True).verdict == "improvement"


def test_the_same_distribution_is_no_change():
    c = judge(rounds(draws(100, 0.01, 15, 5)), rounds(draws(100, 0.01, 15, 6)))
    assert c.verdict == "no change" and 0.95 < c.ci_low <= c.ci_high < 1.05


def test_pairing_decides_what_the_unpaired_method_cannot():
    """Round drift of 12 % shared, 1 % own: unpaired it straddles; paired it is
    no change, and a 10 % slowdown a regression, not noisy although the arms
    are (robust CV 15 %): the noise a paired verdict sees is its rounds'
    ratios', where the shared drift cancels.  Noise in the ratios is flagged."""
    a, b = drifting(15, 7, shared=0.12)
    assert judge(a, b).verdict == "unreliable"                       # no rounds: unpaired
    paired = judge(rounds(a), rounds(b))
    assert paired.verdict == "no change" and paired.method == "paired-wilcoxon"
    a, b = drifting(15, 8, shared=0.15, effect=1.10)
    slow = judge(rounds(a), rounds(b))
    assert slow.verdict == "regression" and slow.noisy == "" and slow.rcv > 0.09
    a, b = drifting(15, 8, shared=0.0, own=0.15, effect=1.5)
    loud = judge(rounds(a), rounds(b))
    assert loud.noisy.startswith("paired noise 1") and "noisy" in loud.reason


def test_one_outlier_round_is_named_not_dropped_and_does_not_break_the_verdict():
    a, b = draws(110, 0.02, 15, 9), draws(100, 0.02, 15, 10)
    b[4] *= 1.8                                   # one disturbed baseline trial
    c = judge(rounds(a), rounds(b))
    assert c.verdict == "regression" and c.method == "paired-wilcoxon" and c.n == 15
    assert [(o.round, o.arm, o.position) for o in c.outliers] == [(4, "B", 8)]
    assert c.outliers[0].factor == pytest.approx(1.8, rel=0.1)
    assert "round 4 B (trial 8) x1." in str(c.outliers[0])


def test_several_outlier_rounds_switch_to_median_and_sign_test():
    a, b = draws(110, 0.02, 20, 11), draws(100, 0.02, 20, 12)
    for r in (2, 9, 15):
        a[r] *= 1.3
    c = judge(rounds(a), rounds(b), crit=criteria.Criteria(min_rounds=20, max_rounds=20))
    assert c.method == "paired-sign" and c.verdict == "regression"
    assert {o.round for o in c.outliers} == {2, 9, 15}
    d = np.log(np.array(a) / b)
    assert c.ratio == pytest.approx(np.exp(np.median(d)))


def test_too_few_complete_rounds_fall_back_to_unpaired_with_the_noise_gate():
    a, b = rounds(draws(130, 0.02, 15, 13)), rounds(draws(100, 0.02, 15, 14))
    few = Observations(a.values[:5], a.rounds[:5], a.positions[:5])
    c = judge(few, b)                             # 5 common rounds: too few to pair
    assert c.method == "unpaired" and c.verdict == "regression"
    noisy = judge(rounds(draws(100, 0.4, 5, 7)), rounds(draws(100, 0.4, 15, 8)))
    assert noisy.method == "unpaired" and noisy.verdict == "unreliable"
    assert "too noisy for the unpaired method" in noisy.reason
    assert "too few samples" in judge([1.0, 2.0], [1.0, 2.0, 3.0]).reason


def test_a_change_inside_the_tolerance_is_not_a_regression():
    a, b = drifting(15, 15, effect=1.03)
    c = judge(rounds(a), rounds(b))
    assert c.verdict == "no change" or "inside" in c.reason
    assert c.verdict != "regression"


def test_a_change_just_beyond_the_tolerance_must_be_shown_to_exceed_it():
    """Significant, centre +5.3 %, but the margin test's one-sided bound lies
    inside the 5 % band: not a regression yet (the old rule called it one)."""
    a, b = drifting(15, 0, shared=0.05, own=0.035, effect=1.065)
    c = judge(rounds(a), rounds(b))
    assert c.verdict == "unreliable" and c.p_value < 0.05 and c.ratio > 1.05
    assert c.reason == ("changed +5.3%, but its one-sided 80.0% bound 1.047 lies inside ±5%: "
                        "not shown to exceed it")


def test_unpaired_ci_is_reproducible_and_p_is_mann_whitney():
    a, b = draws(110, 0.03, 11, 11), draws(100, 0.03, 11, 12)
    c1, c2 = judge(a, b), judge(a, b)
    assert (c1.ci_low, c1.ci_high) == (c2.ci_low, c2.ci_high)
    assert c1.p_value == pytest.approx(sps.mannwhitneyu(a, b, alternative="two-sided").pvalue)


def test_one_disturbed_round_does_not_make_an_arm_noisy():
    calm = draws(100, 0.01, 9, 13)
    assert stats.summarize(calm + [130.0]).rcv < 0.03 < stats.summarize(calm + [130.0]).cv


def test_a_comparison_survives_json_and_csv():
    a, b = draws(110, 0.02, 15, 9), draws(100, 0.02, 15, 10)
    b[4] *= 1.8
    c = judge(rounds(a), rounds(b))
    again = comparison.Comparison(**json.loads(json.dumps(c.as_dict())))
    assert again == c
    assert c.as_row()["outliers"].startswith("round 4 B (trial 8)")


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


def test_a_neighbours_thp_faults_are_named_and_do_not_make_a_pair_incomparable():
    """An A/A beside a QEMU guest: the machine-wide THP fault counter moves
    in one arm's trials only, while the trials' own mappings are in the same
    state.  With the neighbour measured, the difference is named as maybe
    the neighbour's and the pair stays comparable; without one, it is a
    different state, as before; an own-state difference never is excused."""
    busy = {"thp_backed_fraction": 0.0, "neighbour_cpu_share": 0.45}
    a = [sample(busy, {"thp_fault_alloc": n}) for n in (0, 52, 7)]
    b = [sample(busy, {"thp_fault_alloc": 0}) for _ in range(3)]
    found = audit.audit_pair("A", "B", a, b, set()) + audit.audit_arm("A", a)
    assert found and all(f.beside and not f.matters_for("m_ns") for f in found)
    assert "beside a neighbour that took up to 45%" in str(found[0])
    quiet = {"thp_backed_fraction": 0.0, "neighbour_cpu_share": 0.01}
    still = audit.audit_pair("A", "B", [sample(quiet, {"thp_fault_alloc": 8})] * 3,
                             [sample(quiet, {"thp_fault_alloc": 0})] * 3, set())
    assert still and all(f.matters_for("m_ns") for f in still)
    own = audit.audit_pair("A", "B", [sample({**busy, "thp_backed_fraction": 1.0})] * 3, b, set())
    assert any(f.check == "THP backing of the mapping" and f.matters_for("m_ns") for f in own)


def test_the_trials_own_cgroup_reading_decides_where_it_has_one():
    """A host trial's own memory cgroup counted its THP faults: the
    machine-wide counter (a neighbour's faults in it) is not read at all,
    while a difference in the trial's own count is a different state, with
    no neighbour to excuse it; splits, which no cgroup counts, stay
    machine-wide."""
    busy = {"thp_backed_fraction": 0.0, "neighbour_cpu_share": 0.45, "memcg_thp_fault_alloc": 0}
    a = [sample(busy, {"thp_fault_alloc": n}) for n in (0, 52, 7)]
    b = [sample(busy, {"thp_fault_alloc": 0}) for _ in range(3)]
    assert audit.audit_pair("A", "B", a, b, set()) + audit.audit_arm("A", a) == []
    own = [sample({**busy, "memcg_thp_fault_alloc": 16}, {"thp_fault_alloc": 16})] * 3
    found = audit.audit_pair("A", "B", own, b, set())
    assert [f.check for f in found] == ["THP faults and swap-outs of the trial's own cgroup"]
    assert found[0].matters_for("m_ns") and "memcg_thp_fault_alloc 16 in A vs 0 in B" in str(found[0])
    assert audit.audit_pair("A", "B", own, b, {"thp"}) == []
    split = [sample(busy, {"thp_split_page": 3})] * 3
    (named,) = audit.audit_pair("A", "B", split, b, set())
    assert named.beside and "thp_split_page" in str(named)
    v1 = {"thp_backed_fraction": 0.0, "neighbour_cpu_share": 0.45, "memcg_swap_kb": 0.0}
    machine_swap = [sample({**v1, "swap_used_kb": 900.0})] * 3
    assert audit.audit_pair("A", "B", machine_swap, [sample({**v1, "swap_used_kb": 0.0})] * 3,
                            set()) == []


def test_swap_in_use_on_one_side_only_is_found():
    used = [sample({"swap_total_kb": 65536, "swap_used_kb": 1000}) for _ in range(3)]
    none = [sample({"swap_total_kb": 0, "swap_used_kb": 0}) for _ in range(3)]
    checks = {f.check for f in audit.audit_pair("A", "B", used, none, set())}
    assert checks == {"swap configured", "swap used"}
    assert audit.audit_pair("A", "B", used, none, {"swap"}) == []


def test_swap_left_in_use_after_a_reclaim_sample_leaves_its_figures_comparable():
    """6.12's swap slot caches keep a few freed slots counted as used after
    reclaim's sample, 7.3 none: named, and no reason to call reclaim's per
    page reclaimed figures incomparable, while any other metric's still is."""
    left = [sample({"swap_total_kb": 262140, "swap_used_kb": 288}, {"pswpout": 57000})] * 3
    freed = [sample({"swap_total_kb": 262140, "swap_used_kb": 0}, {"pswpout": 57000})] * 3
    (f,) = audit.audit_pair("7.3", "6.12", freed, left, {"kernel"})
    assert f.check == "swap used"
    assert not f.matters_for("reclaim_kernel_insns_per_page")
    assert f.matters_for("advise_kernel_insns_per_page")


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


def test_the_kernel_under_test_never_excuses_a_page_state_difference():
    """Seed 001's trap: 6.19 backed the mapping with THPs, 6.12 did not."""
    new = [sample({"kernel": "6.19", "thp_backed_fraction": 1.0, "swap_total_kb": 0,
                   "swap_used_kb": 0, "ksm_merged_fraction": 0.0},
                  {"thp_fault_alloc": 8, "thp_split_page": 8, "pswpout": 0}) for _ in range(3)]
    old = [sample({"kernel": "6.12", "thp_backed_fraction": 0.0, "swap_total_kb": 0,
                   "swap_used_kb": 1000, "ksm_merged_fraction": 1.0},
                  {"thp_fault_alloc": 0, "thp_split_page": 0, "pswpout": 300}) for _ in range(3)]
    found = audit.audit_pair("6.19", "6.12", new, old, differing_axes={"kernel"})
    checks = {f.check for f in found}
    assert {"THP backing of the mapping", "THP faults, splits and swap-out fallbacks",
            "swap used", "pages swapped out", "KSM merging"} <= checks
    assert "kernel" not in checks                                      # asked for: it may differ
    thp = next(f for f in found if f.check == "THP backing of the mapping")
    assert str(thp).endswith("1 in 6.19 vs 0 in 6.12: the kernel changed the page state")
    for axis in ("cpus", "memory_mb"):
        assert audit.audit_pair("a", "b", new, old, {axis})
    # The axis that asks for THP (and only that one) explains THP backing.
    thp_pair = {f.check for f in audit.audit_pair("a", "b", new, old, {"thp", "kernel"})}
    assert "THP backing of the mapping" not in thp_pair and "swap used" in thp_pair


def mthp(sizes: dict[int, str], top: str = "madvise", **events: float) -> dict:
    """The state mmwork records on a kernel with mTHP: each size's mode and
    its counters over the sample (all zero unless given, e.g. alloc_64=8)."""
    state: dict = {"mthp": "available", "thp_enabled": top, "thp_pmd_size_kb": 2048}
    for kb, mode in sizes.items():
        state[f"mthp_{kb}kB_enabled"] = mode
        for c in audit.MTHP_COUNTERS:
            state[f"mthp_{kb}kB_{c}"] = 0.0
    for name, v in events.items():
        counter, kb = name.rsplit("_", 1)
        state[f"mthp_{kb}kB_{dict(alloc='anon_fault_alloc').get(counter, counter)}"] = v
    return state


NO_MTHP = {"mthp": "not available", "thp_enabled": "madvise", "thp_pmd_size_kb": 2048}


def test_a_kernel_that_backs_the_mapping_with_mthp_is_not_comparable():
    """6.19 with 64 kB mTHP on against a kernel without mTHP: AnonHugePages
    is 0 on both, yet one side's memory was large folios."""
    new = [sample({"kernel": "6.19", **mthp({64: "always", 2048: "inherit"}, alloc_64=256)})
           for _ in range(3)]
    old = [sample({"kernel": "6.1", **NO_MTHP}) for _ in range(3)]
    found = audit.audit_pair("6.19", "6.1", new, old, differing_axes={"kernel"})
    assert {f.check for f in found} == {"mTHP sizes enabled",
                                        "mTHP allocations, fallbacks, splits and swap-outs"}
    sizes = next(f for f in found if f.check == "mTHP sizes enabled")
    assert str(sizes) == ("mTHP sizes enabled: anon_thp_sizes 64kB=always, 2048kB=madvise in "
                          "6.19 vs 2048kB=madvise in 6.1: the kernel changed the page state")
    (alloc,) = [f for f in found if "anon_fault_alloc" in f.detail]
    assert "mthp_64kB_anon_fault_alloc 256 in 6.19 vs not available in 6.1" in alloc.detail
    # The THP axes (and mapping shape) ask for it; cpus and memory never do.
    assert audit.audit_pair("a", "b", new, old, {"thp_mode", "kernel"}) == []
    assert audit.audit_pair("a", "b", new, old, {"align", "kernel"}) == []
    assert audit.audit_pair("a", "b", new, old, {"cpus"})
    # A kernel without mTHP and one with every small size off ran in the same state.
    off = [sample({"kernel": "6.12", **mthp({64: "never", 2048: "inherit"})}) for _ in range(3)]
    assert audit.audit_pair("6.12", "6.1", off, old, {"kernel"}) == []
    # Splitting mTHPs on one side only (same modes) is a different state too.
    split = [sample({"kernel": "6.12", **mthp({64: "never", 2048: "inherit"}, split_64=3)})
             for _ in range(3)]
    (f,) = audit.audit_pair("a", "b", split, off, {"kernel"})
    assert "mthp_64kB_split 3 in a vs 0 in b" in f.detail
    # The PMD size is the THP checks' business, on every kernel alike.
    pmd = [sample({"kernel": "6.12", **mthp({64: "never", 2048: "inherit"}, alloc_2048=8)})
           for _ in range(3)]
    assert audit.audit_pair("a", "b", pmd, old, {"kernel"}) == []


def test_kernel_mm_actors_are_excused_only_by_the_axis_that_sets_them():
    actors = {"damon": "off", "khugepaged": "defrag=1 pages_to_scan=4096 "
              "scan_sleep_millisecs=10000 max_ptes_none=511", "ksmd": "run=0",
              "compaction_proactiveness": "20"}
    quiet = [sample(actors) for _ in range(3)]
    damon = [sample({**actors, "damon": "kdamond 0 (paddr: pageout)"}) for _ in range(3)]
    for axes in (set(), {"kernel"}, {"thp"}, {"sysctl.vm.swappiness"}, {"ksm.run"}):
        (f,) = audit.audit_pair("A", "B", damon, quiet, axes)
        assert str(f) == "DAMON running: damon kdamond 0 (paddr: pageout) in A vs off in B"
    assert audit.audit_pair("A", "B", damon, quiet, {"damon"}) == []
    ksmd = [sample({**actors, "ksmd": "run=1"}) for _ in range(3)]
    assert audit.audit_pair("A", "B", ksmd, quiet, {"ksm.run"}) == []
    assert audit.audit_pair("A", "B", ksmd, quiet, {"ksm.pages_to_scan"})
    proactive = [sample({**actors, "compaction_proactiveness": "0"}) for _ in range(3)]
    assert audit.audit_pair("A", "B", proactive, quiet,
                            {"sysctl.vm.compaction_proactiveness"}) == []
    assert audit.audit_pair("A", "B", proactive, quiet, {"sysctl.vm.swappiness"})
    # A kdamond started halfway through an arm splits the arm too.
    (f,) = audit.audit_arm("A", quiet[:2] + damon[:1])
    assert f.check == "DAMON running" and "varied within arm A" in f.detail


def test_an_arm_run_without_probes_cannot_show_the_same_state():
    blind = [sample() for _ in range(3)]
    for s in blind:
        s.params["no-probes"] = True
    (f,) = audit.audit_pair("A", "B", [sample({"damon": "off"}) for _ in range(3)], blind, set())
    assert f.check == "page state measured" and "B ran with --no-probes" in f.detail


def test_a_neighbours_state_calls_for_no_matched_control():
    """Controls force a state the arms differ in; a machine-wide difference
    a neighbour may explain is not the arms', so none is derived for it."""
    from mmlab.experiment.plan import parse
    from mmlab.judge import controls
    plan = parse('name = "aa"\nworkload = "pageout-refault"\nrepetitions = 3\n'
                 'metrics = ["advise_ns_per_page"]\nbaseline = "A"\n'
                 '[[arms]]\nname = "A"\n[[arms]]\nname = "B"\n')
    busy = {"thp_backed_fraction": 0.0, "neighbour_cpu_share": 0.45}
    a = [sample(busy, {"thp_fault_alloc": 52})] * 3
    b = [sample(busy, {"thp_fault_alloc": 0})] * 3
    found = {("B", "A"): audit.audit_pair("B", "A", a, b, set())}
    assert found[("B", "A")] and controls.derive(plan, found) == []
    quiet = {("B", "A"): audit.audit_pair("B", "A", [sample({}, {"thp_fault_alloc": 52})] * 3,
                                          [sample({}, {"thp_fault_alloc": 0})] * 3, set())}
    assert controls.derive(plan, quiet)


def guest(memory_mb: int, boot_thp: bool, **state: object) -> list[Sample]:
    """A guest's samples whose kernel booted with THP on or off (a guest
    below 512 MiB of MemTotal: every THP flag cleared), the arm having set
    thp_mode = always either way."""
    flags = ({"boot_thp_enabled": "always", "boot_thp_defrag": "madvise",
              "boot_thp_use_zero_page": 1.0, "boot_thp_khugepaged_defrag": 1.0} if boot_thp
             else {"boot_thp_enabled": "never", "boot_thp_defrag": "never",
                   "boot_thp_use_zero_page": 0.0, "boot_thp_khugepaged_defrag": 0.0})
    return [sample({"target": "qemu", "guest_memory_mb": float(memory_mb),
                    "mem_total_kb": memory_mb * 1024 * 0.94, "thp_enabled": "always",
                    "thp_defrag": "madvise", **flags, **state}) for _ in range(3)]


def test_a_guest_booted_with_thp_off_by_its_memory_is_not_comparable_and_says_why():
    """512 MiB of guest memory leaves MemTotal below 512 MiB, and the kernel
    boots with every THP flag cleared (no huge zero page, no khugepaged
    defrag) though the arm then sets thp_mode: the same program ran 16x the
    kernel instructions per page there.  The pair is not comparable, and
    the compare's reason says why in words."""
    from mmlab.experiment.plan import parse
    from mmlab.judge import verdicts
    from mmlab.report.terminal.experiment import reasons
    small, large = guest(512, boot_thp=False), guest(1024, boot_thp=True)
    found = audit.audit_pair("small", "large", small, large, {"memory_mb"})
    assert {f.check for f in found} == {"guest THP at boot"} and len(found) == 4
    f = found[0]
    assert "boot_thp_enabled never in small vs always in large" in f.detail
    assert ("small: 512 MiB guest, MemTotal 481 MiB: the kernel turns THP off below 512 MiB "
            "of memory") in f.detail
    assert audit.audit_pair("a", "b", guest(1024, True), large, {"memory_mb"}) == []
    plan = parse('name = "mem"\nworkload = "pageout-refault"\nkernel = "debian:6.12"\n'
                 'repetitions = 3\nmetrics = ["advise_ns_per_page"]\n'
                 'baseline = { memory_mb = 1024 }\n'
                 '[matrix]\nmemory_mb = [512, 1024]\n')
    arms = [a.name for a in plan.arms]
    judged = verdicts.judge(plan, {arms[0]: small, arms[1]: large})
    (line,) = [r for r in reasons(judged.comparisons) if "not comparable" in r]
    assert "guest THP at boot" in line and "turns THP off below 512 MiB" in line


def test_arms_that_share_a_guest_booted_with_thp_off_are_told_so():
    """Same state on both sides is comparable, but a guest whose kernel
    turned THP off is named in words, with the mode in force."""
    small = guest(512, boot_thp=False, thp_enabled="never", thp_defrag="never")
    assert audit.audit_pair("a", "b", small, small, set()) == []
    assert audit.guest_thp_notes({"a": small, "b": small, "c": guest(1024, True)}) == [
        "a, b: guest THP: never at boot (512 MiB guest, MemTotal 481 MiB: the kernel turns "
        "THP off below 512 MiB of memory); during the trial: never, defrag never"]


def test_min_free_kbytes_differs_only_with_what_sets_it():
    low = [sample({"min_free_kbytes": 5000.0})] * 3
    high = [sample({"min_free_kbytes": 45056.0})] * 3
    (f,) = audit.audit_pair("a", "b", low, high, {"swap"})
    assert f.check == "min_free_kbytes"
    for axis in ("memory_mb", "thp_mode", "sysctl.vm.min_free_kbytes"):
        assert audit.audit_pair("a", "b", low, high, {axis}) == []


COUNTED = """\
name = "counted"
workload = "pageout-refault"
repetitions = {rounds}
metrics = ["advise_kernel_insns_per_page", "post_touch_kernel_insns_per_page"]
baseline = {{ kernel = "debian:6.1" }}
[params]
mapping-kb = 1024
[matrix]
kernel = ["debian:6.1", "debian:6.12"]
"""


def counted(rounds: int) -> Plan:
    return parse(COUNTED.format(rounds=rounds), "counted.toml")


def counted_verdicts(tmp_path, rounds: int) -> set[tuple[str, criteria.Verdict]]:
    """(method, verdict) of both metrics when 6.12 counts 2.22x the
    instructions of 6.1 with 0.1% spread, judged at `rounds` rounds."""
    plan = counted(rounds)
    store = Store(tmp_path / f"r{rounds}")
    exp = store.create_experiment(plan)
    runner.run(store, exp, plan, fake_pool(FakeTarget({"kernel=debian:6.12": 2.22}, cv=0.001)))
    judged = verdicts.judge(store.plan(exp), store.measurements(exp))
    return {(c.method, c.verdict) for c in judged.comparisons}


def test_a_huge_counted_change_is_decided_by_the_count_rule_at_any_rounds(tmp_path):
    """A 2.22x counted change with 0.1% spread: six paired rounds cannot give
    a rank test's p below 2 / 2^6 = 0.031, and Holm over two metrics needed
    0.025, so it was unreliable and the plan advised 7 rounds (4 at first,
    which could not decide either).  Counts are judged by the count rule,
    outside the family: 3, 4 and 6 rounds decide it, and the plan warns of
    nothing."""
    for rounds in (3, 4, 6):
        assert counted(rounds).warnings() == []
        assert counted_verdicts(tmp_path, rounds) == {
            ("count rule (range separation)", criteria.Verdict.REGRESSION)}


def test_a_time_beside_a_count_is_advised_the_rounds_its_own_test_needs():
    """The family is the timed metrics alone: one time beside one count is
    one test, which 4 rounds can decide (Mann-Whitney's smallest p, 2/70),
    where Holm over both asked for 7."""
    def mixed(rounds: int) -> Plan:
        return parse(COUNTED.format(rounds=rounds).replace(
            '"post_touch_kernel_insns_per_page"', '"advise_ns_per_page"'), "mixed.toml")
    assert mixed(4).tests() == 1 and mixed(4).warnings() == []
    (warned,) = mixed(3).warnings()
    assert "use 4 or more" in warned
