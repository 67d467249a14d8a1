"""Several saved boots per kernel: a counted plan's rounds rotate over them,
every arm of a round takes the boot of one index, its samples name it, and
the audit names a kernel whose boots disagree on a count beyond their own
trials' spread, and a pair whose difference the choice of a boot explains."""

from __future__ import annotations

import collections
import re

import pytest

from mmlab.attribution.functions import FunctionInsns
from mmlab.errors import MmlabError
from mmlab.experiment.plan import pairs, parse
from mmlab.judge import audit, states, verdicts
from mmlab.judge.criteria import Verdict
from mmlab.judge.states import STATE_FUNCTIONS
from mmlab.kernels import qemu_plugin
from mmlab.run import runner
from mmlab.store import Store, Trial
from mmlab.targets import TargetPool, boot, snapshot, trial_arm
from mmlab.workloads.samples import Sample

from .fake_target import RUSAGE, FakeTarget

COUNT = "advise_kernel_insns_per_page"
PROFILE = f"""
name = "states"
workload = "pageout-refault"
repetitions = 4
warmups = 0
metrics = ["{COUNT}"]
baseline = {{ mapping-kb = 512 }}
[params]
rounds = 2
min-ms = 0
[matrix]
mapping-kb = [512, 1024]
kernel = ["debian:6.12"]
"""


def _trial(arm: str, rnd: int) -> Trial:
    return Trial(0, arm, 0, rnd, 0, "planned", None, None, None)


def test_a_counted_plan_rotates_each_arm_over_three_boots_by_round():
    plan = parse(PROFILE.replace("repetitions = 4", "repetitions = 6"))
    assert snapshot.states(plan) == 3
    seen = collections.Counter((a.name, snapshot.rotation(trial_arm(plan, _trial(a.name, r)),
                                                          plan))
                               for r in range(6) for a in plan.arms)
    assert seen == {(a.name, k): 2 for a in plan.arms for k in range(3)}
    timed = parse(PROFILE.replace(COUNT, "advise_ns_per_page"))
    assert snapshot.states(timed) == 1
    # Four rounds (the tracker's counted cells) take two boots twice each.
    assert snapshot.states(parse(PROFILE)) == 2
    assert snapshot.states(parse(PROFILE.replace("repetitions = 4", "repetitions = 5"))) == 3


def test_the_profile_sets_the_boots_and_a_bad_number_names_its_key():
    text = PROFILE.replace("warmups = 0", "warmups = 0\nguest_states = 2")
    assert snapshot.states(parse(text)) == 2
    with pytest.raises(MmlabError, match="guest_states"):
        parse(PROFILE.replace("warmups = 0", "warmups = 0\nguest_states = 0"))


def test_each_saved_boot_of_a_kernel_has_a_key_of_its_own(k612):
    keys = {k: snapshot._key(boot.Guest(k612, state=k), "tcg", 0, [k612.image])
            for k in range(3)}
    assert len(set(keys.values())) == 3


def _sample(value: float, state: str, metric: str = COUNT) -> Sample:
    return Sample(workload="w", sample=0, mmwork_version="1", params={},
                  metrics={metric: value}, counts={}, rusage=RUSAGE, vmstat_delta={},
                  state={"guest_state": state}, errors={})


def _boots(*values: tuple[str, list[float]]) -> list[Sample]:
    return [_sample(v, state) for state, vs in values for v in vs]


def test_boots_that_disagree_beyond_their_spread_are_named_and_keep_the_verdict():
    """debian:6.1's zap as reported: 1,151 from one saved boot, 1,304 from
    another, each within 0.2%; 6.12's three boots agree within 0.1%."""
    apart = _boots(("0:aa", [1151, 1152, 1150]), ("1:bb", [1304, 1303, 1305]))
    (f,) = audit.states_differ("6.1", apart)
    assert f.check == audit.STATES_DIFFER and "0:aa" in str(f) and "1:bb" in str(f)
    assert "1,151" in str(f) and "1,304" in str(f)
    assert not f.matters_for(COUNT)           # the interval carries it, not the audit
    agree = _boots(("0:cc", [1063, 1064]), ("1:dd", [1064, 1063]), ("2:ee", [1064, 1065]))
    assert audit.states_differ("6.12", agree) == []
    # Within their own spread (each boot's trials range 40): not apart.
    noisy = _boots(("0:aa", [1000, 1040]), ("1:bb", [1060, 1100]))
    assert audit.states_differ("x", noisy) == []
    # Timed metrics and booted trials (no state) are not this check's.
    timed = [_sample(v, s, "zap_ns_per_page") for v, s in ((1, "0:a"), (9, "1:b"))]
    assert audit.states_differ("x", timed) == []
    assert audit.states_differ("x", _boots(("", [1151]), ("", [1304]))) == []


def test_one_trial_per_boot_cannot_show_the_boots_apart():
    """debian:6.12's zap over 8 saved boots, one trial each (measured here):
    1,065.7 to 1,080.6, 1.4% apart, where trials of one boot spread up to
    0.9%.  No boot's own spread is known, so no boot is named; with a
    second trial in each boot, their spread decides."""
    once = [1068.0, 1068.0, 1069.3, 1065.7, 1077.3, 1070.3, 1068.8, 1080.6]
    single = _boots(*((f"{k}:b{k}", [v]) for k, v in enumerate(once)))
    assert audit.states_differ("6.12", single) == []
    assert audit.states_explain("6.12", "x", single, _boots(("0:c", [1073.0, 1073.5]))) == []
    twice = _boots(*((f"{k}:b{k}", [v, v + 0.5]) for k, v in enumerate(once)))
    (f,) = audit.states_differ("6.12", twice)
    assert "3:b3" in str(f) and "7:b7" in str(f)


def test_a_difference_within_the_boots_range_is_not_comparable_on_that_count():
    a61 = _boots(("0:aa", [1151, 1152]), ("1:bb", [1304, 1303]))
    a612 = _boots(("0:cc", [1063, 1064]), ("1:dd", [1064, 1063]))
    assert audit.states_explain("6.1", "6.12", a61, a612) == []   # every boot apart
    mid = _boots(("0:ff", [1200, 1201]), ("1:gg", [1200, 1199]))
    (f,) = audit.states_explain("6.1", "other", a61, mid)
    assert f.check == audit.STATES_EXPLAIN and f.matters_for(COUNT)
    assert not f.matters_for("zap_ns_per_page")
    (g,) = [x for x in audit.audit_pair("6.1", "other", a61, mid, {"kernel"})
            if x.check == audit.STATES_EXPLAIN]
    assert g == f
    assert audit.states_explain("6.12", "6.12b", a612, a612) == []


def test_two_saved_boots_of_a_kernel_each_start_half_of_every_arms_rounds(k612, tmp_path):
    """A counted plan of two arms over four rounds in debian:6.12 guests,
    restored from two saved boots: each arm's rounds 0 and 2 from one, 1
    and 3 from the other, the same two for both arms, every sample labelled."""
    qemu_plugin.ensure()
    plan = parse(PROFILE.replace("warmups = 0", "warmups = 0\nguest_states = 2"))
    store = Store(tmp_path / "r")
    exp = store.create_experiment(plan)
    result = runner.run(store, exp, plan, TargetPool(say=lambda _: None), with_controls=False)
    assert (result.done, result.failed) == (8, 0)
    labels: dict[tuple[str, int | None], str] = {}
    for t in store.measurements(exp).trials:
        (s,) = t.samples
        assert s.state["guest_start"] == "restored" and s.metrics[COUNT] > 100
        labels[t.arm, t.round] = str(s.state["guest_state"])
    assert len(labels) == 8
    for arm in plan.arms:
        mine = [labels[arm.name, r] for r in range(4)]
        assert [x.split(":")[0] for x in mine] == ["0", "1", "0", "1"]
        assert mine[0] == mine[2] != mine[1] == mine[3]
    assert {labels[a.name, 1] for a in plan.arms} == {labels[plan.arms[0].name, 1]}


def test_the_judge_never_decides_a_step_the_choice_of_boot_explains():
    """The same arm of 1,151 and 1,304 by boot against 1,200 in every boot
    of its baseline: not comparable; against 1,063: judged as usual."""
    plan = parse(PROFILE)
    (pair,) = pairs(plan)
    arm, base = pair.arm.name, pair.baseline.name
    apart = _boots(("0:aa", [1151, 1152, 1150]), ("1:bb", [1304, 1303, 1305]))
    for baseline, comparable in ((1200, False), (1063, True)):
        flat = _boots(("0:cc", [baseline] * 3), ("1:dd", [baseline + 1] * 3))
        (c,) = verdicts.judge(plan, {arm: apart, base: flat}).comparisons
        assert (c.verdict != Verdict.NOT_COMPARABLE) == comparable, c
        assert comparable or audit.STATES_EXPLAIN in c.reason


def test_boots_that_disagree_name_the_functions_that_differ_between_them():
    """With each boot's counts by function, the finding names the functions
    that moved most between the two boots furthest apart, in the window its
    count is of; without them, the counts alone."""
    apart = _boots(("0:aa", [1151, 1152, 1150]), ("1:bb", [1304, 1303, 1305]))
    functions = {"0": {"advise": {"__free_one_page": 180.0, "release_pages": 140.0,
                                  "memset_erms": 512.0}},
                 "1": {"advise": {"__free_one_page": 330.0, "release_pages": 139.0,
                                  "memset_erms": 512.0, "free_pcppages_bulk": 3.0}}}
    (f,) = audit.audit_arm("6.1", apart, functions)
    assert f.check == audit.STATES_DIFFER
    assert "functions that differ most from boot 0 to 1 (advise, per unit): " \
           "__free_one_page +150, free_pcppages_bulk +3, release_pages -1" in str(f), f
    assert "memset_erms" not in str(f)             # the same in both boots
    (alone,) = audit.audit_arm("6.1", apart)     # judged before attribution: says where
    assert "differ most" not in str(alone) and states.FUNCTIONS_LATER in str(alone)
    # Only one of the two boots counted: nothing to set them against.
    (half,) = audit.audit_arm("6.1", apart, {"0": functions["0"]})
    assert "functions" not in str(half)


RELEASE = "6.12.57+deb13-amd64"


class _StatesTarget(FakeTarget):
    """A kernel whose count depends on the saved boot its trial started
    from (boot 1 dearer by 150 per unit in one function), with attribution
    by function from each boot as the QEMU target makes it."""

    def __init__(self):
        super().__init__(cv=0.0005, model=lambda arm: (
            1.0 + 0.13 * (arm.round % 2), {"guest_state": f"{arm.round % 2}:{arm.name[-4:]}",
                                           "guest_kernel": arm.kernel, "kernel": RELEASE}))

    def attribute(self, arm, plan):
        def count(k: int) -> FunctionInsns:
            return FunctionInsns(windows={"advise": {"__free_one_page": 180.0 + 150 * k,
                                                     "release_pages": 140.0}},
                                 kernel={"advise": 320.0 + 150 * k}, unresolved={},
                                 units={"advise": "page"}, kernel_release="6.1",
                                 text_address=1)
        return snapshot.by_function(arm, plan, set(plan.profile.attribution), count)


def test_compare_names_the_functions_where_a_kernels_saved_boots_disagree(tmp_path):
    """A counted run whose arms' boots disagree: attribution stores each
    boot's counts by function, and the judgement read back from the store
    (as compare and report make it) names the function behind the gap."""
    plan = parse(PROFILE.replace("warmups = 0", 'warmups = 0\nattribution = ["state_functions"]'))
    store = Store(tmp_path / "r")
    exp = store.create_experiment(plan)
    pool = TargetPool(make=lambda arm: target)
    target = _StatesTarget()
    runner.run(store, exp, plan, pool, with_controls=False)
    assert runner.attribute(store, exp, plan, pool) == 2
    stored = store.attributions(exp)
    assert all(set(kinds) == {"functions", STATE_FUNCTIONS} and set(kinds[STATE_FUNCTIONS])
               == {"0", "1"} for kinds in stored.values())     # 4 rounds: two boots
    judged = verdicts.judge(plan, store.measurements(exp))
    notes = [str(f) for fs in judged.arm_findings.values() for f in fs]
    assert len(notes) == 2 and all(audit.STATES_DIFFER in n and "__free_one_page +150" in n
                                   and "release_pages" not in n for n in notes), notes


def test_attribution_counts_only_the_boots_the_trials_started_from():
    """by_function counts boot 0 (the one `explain` shows) and, asked for
    state_functions, each other boot the arm's rounds took; a booted arm,
    one trial, or `functions` alone (the tracker's) counts once."""
    counted: list[int] = []

    def count(k: int) -> FunctionInsns:
        counted.append(k)
        return FunctionInsns(windows={"advise": {"f": float(k)}}, kernel={"advise": 1.0},
                             unresolved={}, units={"advise": "page"}, kernel_release="x",
                             text_address=1)
    plan = parse(PROFILE.replace("repetitions = 4", "repetitions = 6"))
    arm = plan.arms[0]
    both = {"functions", STATE_FUNCTIONS}
    got = snapshot.by_function(arm, plan, both, count)
    assert counted == [0, 1, 2] and got["functions"]["windows"] == {"advise": {"f": 0.0}}
    assert got[STATE_FUNCTIONS] == {str(k): {"advise": {"f": float(k)}} for k in range(3)}
    counted.clear()
    booted = arm.model_copy(update={"guest_start": "boot"})
    assert set(snapshot.by_function(booted, plan, both, count)) == {"functions"}
    assert counted == [0]
    counted.clear()
    assert set(snapshot.by_function(arm, plan, {"functions"}, count)) == {"functions"}
    assert counted == [0]
    counted.clear()
    single = plan.model_copy(update={"profile": plan.profile.model_copy(
        update={"repetitions": 1})})            # `mmlab run --functions`: one trial
    assert STATE_FUNCTIONS not in snapshot.by_function(arm, single, both, count)
    assert counted == [0]
    assert snapshot.by_function(arm, plan, both, lambda k: None) == {}


def _mmlab(tmp_path, monkeypatch):
    """The CLI on a store of its own, every arm's trials on a _StatesTarget;
    returns a call that runs a command and gives its output, whitespace
    made single spaces (the terminal wraps lines)."""
    from typer.testing import CliRunner

    from mmlab.cli import app
    target = _StatesTarget()
    monkeypatch.setattr(TargetPool, "local_target", lambda pool, arm: target)
    results = str(tmp_path / "r")

    def mmlab(*args: str) -> str:
        ran = CliRunner().invoke(app, [*args, "--results", results])
        assert ran.exit_code == 0, ran.output
        return " ".join(ran.output.split())
    return mmlab


ONE_ARM = f"""
name = "one kernel"
workload = "pageout-refault"
kernel = "debian:6.12"
repetitions = 4
warmups = 0
attribution = ["state_functions"]
metrics = ["{COUNT}"]
baseline = "6.12"
arms = [{{ name = "6.12", set = {{}} }}]
[params]
rounds = 2
min-ms = 0
"""


def test_a_one_arm_experiments_boots_that_disagree_are_shown_where_a_user_reads_it(
        tmp_path, monkeypatch):
    """Four trials of one kernel over two saved boots that disagree: the
    run's summary, compare and the report (text and HTML) name the kernel
    and the boots' values; judged before any attribution, they say where
    the functions will be named, and once attribution counted each boot,
    compare and the report name them."""
    mmlab = _mmlab(tmp_path, monkeypatch)
    profile = tmp_path / "one.toml"
    profile.write_text(ONE_ARM)
    head = f"guest states differ: arm {parse(ONE_ARM).arms[0].name}: saved boots of " \
           f"debian:6.12 ({RELEASE}): "
    ran = mmlab("experiment", "run", str(profile))
    boots = rf"{COUNT} [\d,.]+ from boot 0:6.12 vs [\d,.]+ from 1:6.12 \(\+13\.0%\)"
    assert head in ran and re.search(boots, ran), ran
    assert states.FUNCTIONS_LATER in ran
    for shown in (mmlab("compare", "1"), mmlab("report", "1")):
        assert head in shown and states.FUNCTIONS_LATER in shown, shown
    assert all("no pair of arms to compare" in mmlab(cmd, "1") for cmd in ("compare", "report"))
    # Attribution after the trials: this summary was judged before it, so
    # it still says where; compare and the report, read from the store, name them.
    again = mmlab("experiment", "resume", "1", "--attribute")
    assert "attribution stored for 1 arm(s)" in again and states.FUNCTIONS_LATER in again
    named = "functions that differ most from boot 0 to 1 (advise, per unit): __free_one_page +150"
    for shown in (mmlab("compare", "1"), mmlab("report", "1"),
                  mmlab("report", "1", "--format", "html")):
        assert head in shown and named in shown and states.FUNCTIONS_LATER not in shown, shown


def test_compare_notes_a_pairs_boots_that_disagree_without_calling_it_not_comparable(
        tmp_path, monkeypatch):
    """Both arms' boots disagree the same way (the boot, not the arm, moves
    the count): compare says so for each arm, as a note no verdict rests on."""
    mmlab = _mmlab(tmp_path, monkeypatch)
    profile = tmp_path / "pair.toml"
    profile.write_text(PROFILE)
    mmlab("experiment", "run", str(profile), "--no-controls")
    shown = mmlab("compare", "1")
    assert "same-state audit, noted (no verdict above rests on it):" in shown, shown
    for arm in parse(PROFILE).arms:
        assert f"guest states differ: arm {arm.name}: saved boots of debian:6.12" in shown
    assert "not comparable" not in shown
