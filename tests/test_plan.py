"""The stored plan and the Target seam: the runner runs any target, the plan
is read back whole, and read-only commands never run mmwork."""

from __future__ import annotations

import os
import subprocess
import sys

from mmlab.experiment.plan import Plan, parse
from mmlab.experiment.schedule import schedule, slots
from mmlab.judge import verdicts
from mmlab.run import runner
from mmlab.store import Store, status_counts

from .fake_target import FakeTarget, fake_pool

PROFILE = """\
name = "fake"
workload = "pageout-refault"
repetitions = 5
metrics = ["cycle_ns_per_page", "advise_ns_per_page"]
baseline = { thp = "nohugepage" }

[params]
mapping-kb = 1024

[matrix]
thp = ["hugepage", "nohugepage"]
cpus = [1, 2]
"""


def _run(tmp_path, fake: FakeTarget) -> tuple[Store, int, Plan]:
    plan = parse(PROFILE, "fake.toml")
    store = Store(tmp_path / "r")
    exp_id = store.create_experiment(plan)
    runner.run(store, exp_id, plan, fake_pool(fake))
    return store, exp_id, plan


def test_the_plan_is_read_back_as_it_was_stored(tmp_path):
    store, exp_id, plan = _run(tmp_path, FakeTarget())
    again = store.plan(exp_id)
    assert again == plan
    assert again.workload.metric("advise_ns_per_page").direction == "lower"
    assert again.arm("thp=hugepage,cpus=2").values == {"thp": "hugepage", "cpus": 2}


def test_the_runner_runs_every_trial_on_its_target_in_planned_order(tmp_path):
    fake = FakeTarget(fail={"thp=hugepage,cpus=1"})
    store, exp_id, plan = _run(tmp_path, fake)
    assert fake.checked == 1
    assert fake.trials == [name for _, name in plan.order]
    counts = status_counts(store.trials(exp_id))
    assert counts == {"done": 15, "failed": 5, "planned": 0, "running": 0}
    failed = store.trials(exp_id, status="failed")[0]
    assert failed.error == "thp=hugepage,cpus=1: failed on purpose"


def test_a_planted_difference_is_judged_from_the_stored_plan(tmp_path):
    store, exp_id, _ = _run(tmp_path, FakeTarget({"thp=hugepage,cpus=1": 1.3,
                                                  "thp=hugepage,cpus=2": 1.3}))
    judged = verdicts.judge(store.plan(exp_id), store.samples_by_arm(exp_id))
    assert {c.verdict for c in judged.comparisons} == {"regression"}


def test_read_only_commands_run_no_mmwork(tmp_path):
    store, exp_id, _ = _run(tmp_path, FakeTarget())
    store.close()
    env = {**os.environ, "MMLAB_MMWORK": str(tmp_path / "no-mmwork")}   # any use would fail
    results = str(tmp_path / "r")
    for args in (["show", str(exp_id)], ["compare", str(exp_id), "--json"],
                 ["report", str(exp_id)], ["bundle", str(exp_id), str(tmp_path / "b")]):
        proc = subprocess.run([sys.executable, "-m", "mmlab.cli", *args, "--results", results],
                              capture_output=True, text=True, env=env)
        assert proc.returncode == 0, (args, proc.stderr)


def test_each_trial_keeps_its_place_in_the_round_and_an_old_store_gets_it(tmp_path):
    """The position within the round is stored with every trial; a store from
    before that column is migrated when opened, matched-state controls
    counted in their own rounds."""
    store, exp_id, plan = _run(tmp_path, FakeTarget())
    controls = [plan.arms[0].model_copy(update={"name": f"ctl{i}", "control_of": plan.arms[0].name,
                                                "control": f"thp={i}"}) for i in (1, 2)]
    store.add_arms(exp_id, plan, controls, schedule(["ctl1", "ctl2"], 5, 9))
    placed = [(t.arm, t.round, t.slot) for t in store.trials(exp_id)]
    assert [s for _, _, s in placed] == slots(plan.order) + [0, 1] * 5
    assert {t.slot for t in store.measurements(exp_id).trials} == {0, 1, 2, 3}
    store.db.execute("ALTER TABLE trials DROP COLUMN slot")          # as an older mmlab wrote it
    store.close()
    again = Store(tmp_path / "r", create=False)
    assert [(t.arm, t.round, t.slot) for t in again.trials(exp_id)] == placed
