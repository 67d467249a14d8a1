"""Counting each saved boot by function costs an attribution boot per boot,
so attribution pays it only where it tells something: for an arm whose
saved boots disagree on a count (the audit's `guest states differ`, read
from the stored samples when attribution starts), or where the profile
names `state_functions`; every other arm keeps its one count by function."""

from __future__ import annotations

from mmlab.attribution.functions import FunctionInsns
from mmlab.experiment.plan import parse
from mmlab.judge import audit, states, verdicts
from mmlab.judge.states import STATE_FUNCTIONS
from mmlab.report import auditnotes, data, text
from mmlab.run import runner
from mmlab.store import Store
from mmlab.targets import TargetPool, snapshot

from .test_guest_states import PROFILE, RELEASE, _StatesTarget

FLAGGED = 1024       # the arm (mapping-kb) whose saved boots disagree


class _OneArmApart(_StatesTarget):
    """Boot 1 dearer by 13% for the FLAGGED arm only; attribution as the
    QEMU target plans it (a profile naming no kind gets every kind a guest
    makes), noting each boot it counts by function, by arm."""

    def __init__(self):
        super().__init__()
        self.model = lambda arm: (
            1.0 + 0.13 * (arm.round % 2) * (arm.params["mapping-kb"] == FLAGGED),
            {"guest_state": f"{arm.round % 2}:{arm.name[-4:]}", "guest_kernel": arm.kernel,
             "kernel": RELEASE})
        self.counted: dict[str, list[int]] = {}

    def attribute(self, arm, plan):
        def count(k: int) -> FunctionInsns:
            self.counted.setdefault(arm.name, []).append(k)
            extra = 150 * k * (arm.params["mapping-kb"] == FLAGGED)
            return FunctionInsns(windows={"advise": {"__free_one_page": 180.0 + extra,
                                                     "release_pages": 140.0}},
                                 kernel={"advise": 320.0 + extra}, unresolved={},
                                 units={"advise": "page"}, kernel_release="6.1",
                                 text_address=1)
        wanted = set(plan.profile.attribution) or {"guest_trace", "functions", STATE_FUNCTIONS}
        return snapshot.by_function(arm, plan, wanted, count)


def _run(tmp_path, profile: str) -> tuple[Store, int, _OneArmApart]:
    plan = parse(profile)
    store = Store(tmp_path / "r")
    exp = store.create_experiment(plan)
    target = _OneArmApart()
    pool = TargetPool(make=lambda arm: target)
    runner.run(store, exp, plan, pool, with_controls=False)
    assert runner.attribute(store, exp, plan, pool) == 2
    return store, exp, target


def _flagged(plan) -> str:
    return next(a.name for a in plan.arms if a.params["mapping-kb"] == FLAGGED)


def test_only_an_arm_whose_saved_boots_disagree_counts_each_boot_by_function(tmp_path):
    """A profile naming no attribution kind: the arm whose boots agree is
    counted by function once (boot 0), the one whose boots disagree from
    each of its two boots; the audit, judged from the store as compare and
    report judge it, names the function behind the gap for that arm, in
    compare's notes and in the report."""
    plan = parse(PROFILE)
    store, exp, target = _run(tmp_path, PROFILE)
    flagged = _flagged(plan)
    stored = store.attributions(exp)
    assert {arm: set(kinds) for arm, kinds in stored.items()} == {
        a.name: {"functions", STATE_FUNCTIONS} if a.name == flagged else {"functions"}
        for a in plan.arms}
    assert set(stored[flagged][STATE_FUNCTIONS]) == {"0", "1"}
    assert target.counted == {
        a.name: [0, 1] if a.name == flagged else [0] for a in plan.arms}
    judged = verdicts.judge(plan, store.measurements(exp))
    (finding,) = judged.arm_findings[flagged]
    assert finding.check == audit.STATES_DIFFER and "__free_one_page +150" in str(finding)
    assert not any(judged.arm_findings[a.name] for a in plan.arms if a.name != flagged)
    noted = [line for said in auditnotes.noted(judged, plan.profile.metrics).values()
             for line in said]
    assert any("__free_one_page +150" in line and states.FUNCTIONS_LATER not in line
               for line in noted), noted
    report = text.render(data.gather(store, exp))
    assert "__free_one_page +150" in report and states.FUNCTIONS_LATER not in report


def test_a_profile_that_names_state_functions_counts_every_boot_of_every_arm(tmp_path):
    """Asked for by name, each saved boot is counted by function for the
    arm whose boots agree too."""
    profile = PROFILE.replace("warmups = 0", 'warmups = 0\nattribution = ["state_functions"]')
    store, exp, target = _run(tmp_path, profile)
    assert all(set(kinds) == {"functions", STATE_FUNCTIONS}
               for kinds in store.attributions(exp).values())
    assert all(ks == [0, 1] for ks in target.counted.values()) and len(target.counted) == 2


def test_the_plan_an_arm_attributes_with_leaves_out_state_functions_where_boots_agree():
    """attribution_plan: every other kind kept, for a host's target too;
    a profile naming kinds is left as it is."""
    plan = parse(PROFILE)
    agree = states.attribution_plan(plan, [])
    assert set(agree.profile.attribution) == {"guest_trace", "functions", "stacks", "locks",
                                              "events"}
    named = parse(PROFILE.replace("warmups = 0", 'warmups = 0\nattribution = ["functions"]'))
    assert states.attribution_plan(named, []) is named
