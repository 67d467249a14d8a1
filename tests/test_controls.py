"""Matched-state controls: a pair the audit finds in different page states
gets control arms with that state forced equal, run and judged beside it."""

from __future__ import annotations

from mmlab.experiment.plan import parse
from mmlab.judge import controls, verdicts
from mmlab.judge.audit import Finding
from mmlab.report import data, text
from mmlab.report.terminal import experiment
from mmlab.run import runner
from mmlab.store import Store
from mmlab.targets import qemu

from .fake_target import FakeTarget, fake_pool

# Seed 001's shape: the reporter's unaligned mapping, THP left to the kernel.
PROFILE = """\
name = "seed001-shape"
workload = "pageout-refault"
repetitions = 6
metrics = ["advise_ns_per_page"]
baseline = { kernel = "debian:6.12" }

[params]
mapping-kb = 1024
align = "none"
thp = "default"

[matrix]
kernel = ["debian:6.12", "debian:6.19"]
"""


def seed001_kernels(arm):
    """6.19 backs the unaligned mapping with THPs unless told not to; 6.12
    only when asked.  A THP-backed pageout splits every THP: 25% slower."""
    thp = arm.params["thp"]
    backed = thp == "hugepage" or (arm.kernel == "debian:6.19" and thp == "default")
    return (1.25 if backed else 1.0), {"thp_backed_fraction": 1.0 if backed else 0.0}


def _run(tmp_path, with_controls=True):
    plan = parse(PROFILE, "seed001.toml")
    store = Store(tmp_path / "r")
    exp_id = store.create_experiment(plan)
    fake = FakeTarget(model=seed001_kernels, cv=0.005)
    result = runner.run(store, exp_id, plan, fake_pool(fake), with_controls=with_controls)
    return store, exp_id, result, fake


def test_a_kernel_that_changes_thp_backing_gets_matched_state_controls(tmp_path):
    store, exp_id, result, fake = _run(tmp_path)
    plan = store.plan(exp_id)
    assert result.controls == 4
    labels = {(a.control_of, a.control) for a in plan.arms if a.control_of}
    assert labels == {(k, f"thp={m}") for k in ("kernel=debian:6.12", "kernel=debian:6.19")
                      for m in ("nohugepage", "hugepage")}
    # The controls ran after the arms, interleaved among themselves, every round.
    assert fake.trials[:12] == [n for _, n in plan.order[:12]]
    assert sum("[control" in t for t in fake.trials) == 4 * 6
    judged = verdicts.judge(plan, store.measurements(exp_id))
    main = next(c for c in judged.comparisons if "control" not in c.arm)
    assert main.verdict == "not comparable" and "the kernel changed the page state" in main.reason
    assert 1.2 < main.ratio < 1.3          # the ratio is kept, as a different-state figure
    matched = dict(judged.matched[(main.metric, main.arm, main.baseline)])
    assert matched["thp=nohugepage"].verdict == "no change"
    assert matched["thp=hugepage"].verdict == "no change"
    report = text.render(data.gather(store, exp_id))
    assert "in matched state (thp=nohugepage): no change" in report
    lines = experiment.reasons(judged.comparisons, judged.matched)
    assert any("different page state; in matched state (thp=hugepage): no change" in line
               for line in lines)


def test_no_controls_leaves_the_pair_not_comparable_and_adds_no_arms(tmp_path):
    store, exp_id, result, fake = _run(tmp_path, with_controls=False)
    assert result.controls == 0 and len(store.plan(exp_id).arms) == 2
    assert not any("[control" in t for t in fake.trials)


def test_a_ksm_difference_derives_no_control():
    """Merging is what ksm-rmap measures: there is no lever that keeps the question."""
    plan = parse(PROFILE, "seed001.toml")
    a, b = plan.arms[1].name, plan.arms[0].name
    finding = Finding("KSM merging", ("a", "b"), "")
    assert controls.derive(plan, {(a, b): [finding]}) == []


RECLAIM = """\
name = "reclaim-anon"
workload = "reclaim"
repetitions = 6
metrics = ["reclaim_kernel_insns_per_page"]
baseline = { kernel = "debian:6.12" }
params = { memory = "anon" }

[matrix]
kernel = ["debian:6.12", "debian:7.3"]
swap = ["zram:256M"]
"""


def test_a_difference_no_metric_is_judged_by_derives_no_control():
    """reclaim's figures are per page reclaimed, which the swap a kernel
    still counts after the sample leaves comparable (audit.py): no swap=none
    control, which could not run anyway (anon reclaim needs swap).  The
    same difference calls for one where a metric is judged by it."""
    swap = [Finding("swap used", ("a", "b"), "")]
    plan = parse(RECLAIM, "reclaim.toml")
    assert controls.derive(plan, {(plan.arms[1].name, plan.arms[0].name): swap}) == []
    seed = parse(PROFILE, "seed001.toml")
    arms = controls.derive(seed, {(seed.arms[1].name, seed.arms[0].name): swap})
    assert {c.control for c in arms} == {"swap=none"}


def test_a_damon_difference_derives_controls_with_every_damon_actor_stopped():
    """Debian's 6.19 starts damon_stat at boot and 6.12 does not: the control
    pair runs both kernels with DAMON off, and the guest script stops it."""
    plan = parse(PROFILE, "seed001.toml")
    a, b = plan.arms[1].name, plan.arms[0].name
    finding = Finding("DAMON running", ("a", "b"), "")
    arms = controls.derive(plan, {(a, b): [finding]})
    assert {(c.control_of, c.control) for c in arms} == {(a, "damon=off"), (b, "damon=off")}
    assert all(c.settings.damon == "off" and c.settings.fixed_files() == [] for c in arms)
    script = qemu.trial_script(plan.workload, arms[0].params, 1, 0, arms[0].settings)
    assert "echo N > $f" in script and "echo off > $f" in script


def test_a_pair_that_differs_in_two_states_gets_controls_that_force_both():
    plan = parse(PROFILE, "seed001.toml")
    a, b = plan.arms[1].name, plan.arms[0].name
    found = [Finding(c, ("a", "b"), "") for c in ("DAMON running", "THP backing of the mapping")]
    arms = controls.derive(plan, {(a, b): found})
    assert {c.control for c in arms} == {"thp=nohugepage, damon=off", "thp=hugepage, damon=off"}
    assert all(c.settings.damon == "off" for c in arms)
