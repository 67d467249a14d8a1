"""Experiments end to end on this kernel: stored, compared, refused without
consent, and interrupted by SIGINT and SIGKILL without losing or repeating a
trial or leaving a global setting changed.  Adaptive rounds on the fake
target: added at the planned looks until the verdicts decide, bounded by the
maximum and the time budget, and resumable in the middle of added rounds."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
import subprocess
import time
from pathlib import Path

import pytest

from mmlab.errors import Interrupted, MmlabError
from mmlab.experiment.plan import parse, with_limits
from mmlab.experiment.schedule import schedule
from mmlab.judge import verdicts
from mmlab.machine import knobs
from mmlab.report.terminal import experiment
from mmlab.run import runner
from mmlab.run.events import Looked
from mmlab.store import Store
from mmlab.targets import TrialError

from .conftest import MMLAB, is_root, mmlab, run_profile
from .fake_target import FakeTarget, fake_pool

THP = Path(knobs.THP_ENABLED)

QUICK = """\
name = "quick"
workload = "populate-unmap"
repetitions = 3
metrics = ["populate_ns_per_page", "unmap_ns_per_page"]
baseline = "small"
seed = 11

[params]
seconds = 0.05
workers = 1

[[arms]]
name = "small"
set = { bytes = "4K" }

[[arms]]
name = "big"
set = { bytes = "64K" }
"""

# Two THP modes, long enough trials to be killed in the middle of one.
THP_MODES = """\
name = "thp-modes"
workload = "populate-unmap"
repetitions = 4
metrics = ["populate_ns_per_page"]
baseline = { thp_mode = "never" }
host_changes = true

[params]
seconds = 0.4
workers = 1

[matrix]
thp_mode = ["always", "never"]
"""


def quick_experiment(tmp_path: Path) -> tuple:
    """QUICK's plan, a store in tmp_path and the experiment created there."""
    plan = parse(QUICK, "quick.toml")
    store = Store(tmp_path / "r")
    return plan, store, store.create_experiment(plan)


def statuses(results: Path) -> dict[str, int]:
    db = sqlite3.connect(f"file:{results}/mmlab.sqlite?mode=ro", uri=True)
    try:
        return dict(db.execute("SELECT status, COUNT(*) FROM trials GROUP BY status").fetchall())
    finally:
        db.close()


def wait_done(results: Path, n: int, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if statuses(results).get("done", 0) >= n:
                return
        except sqlite3.OperationalError:
            pass          # the store or its schema is not there yet
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} trials done in {timeout} s")


@pytest.fixture
def stop_children():
    """Whatever a test starts is stopped gracefully (SIGINT: mmlab restores
    its settings) even when the test fails half-way."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_experiment_stores_every_trial_and_compares(tmp_path):
    proc, _ = run_profile(tmp_path, QUICK)
    assert proc.returncode == 0, proc.stderr
    exp_id = proc.stdout.strip().splitlines()[-1]
    assert exp_id == "1"                                   # the ID is the last line
    assert statuses(tmp_path / "r") == {"done": 6}
    db = sqlite3.connect(tmp_path / "r" / "mmlab.sqlite")
    env = json.loads(db.execute("SELECT environment FROM trials LIMIT 1").fetchone()[0])
    assert {"kernel", "cmdline", "cpu_model", "thp_enabled", "ksm_run", "swap",
            "mmlab_version", "git_commit"} <= env.keys()
    order = [r[0] for r in db.execute("SELECT a.name FROM trials t JOIN arms a ON a.id=t.arm_id "
                                      "ORDER BY t.position")]
    assert all(sorted(order[i:i + 2]) == ["big", "small"] for i in (0, 2, 4))   # interleaved
    rows = json.loads(mmlab("compare", exp_id, "--results", str(tmp_path / "r"), "--json").stdout)
    assert {r["metric"] for r in rows} == {"populate_ns_per_page", "unmap_ns_per_page"}
    for r in rows:
        assert {"metric", "arm", "baseline", "ratio", "ci_low", "ci_high", "p_value", "verdict",
                "reason"} <= r.keys()
        assert (r["arm"], r["baseline"]) == ("big", "small")
    csv_out = mmlab("compare", exp_id, "--results", str(tmp_path / "r"), "--csv").stdout
    assert csv_out.splitlines()[0].startswith("metric,arm,baseline")
    listing = mmlab("experiments", "--results", str(tmp_path / "r")).stdout
    assert "quick" in listing and "populate-unmap" in listing
    shown = mmlab("show", exp_id, "--results", str(tmp_path / "r")).stdout
    assert "6 done" in shown and "order: 0:" in shown
    for r in rows:                                      # how each verdict was reached
        assert r["method"] == "unpaired" and r["rounds"] == 3 and r["looks"] == 1
        assert r["correction"] == "Holm over 2 tests" and r["stopped"]
    assert ",outliers" in csv_out.splitlines()[0]
    # limits on resume: checked, stored, and nothing run twice
    bad = mmlab("experiment", "resume", exp_id, "--results", str(tmp_path / "r"),
                "--max-repetitions", "2")
    assert bad.returncode == 2 and "--max-repetitions" in bad.stderr
    again = mmlab("experiment", "resume", exp_id, "--results", str(tmp_path / "r"),
                  "--budget", "0.5")
    assert again.returncode == 0, again.stderr
    assert "0 run now, 6 already done" in again.stdout and "3 rounds (0 added)" in again.stdout
    assert Store(tmp_path / "r").plan(1).profile.budget_s == 0.5


def test_host_changes_are_refused_without_consent(tmp_path):
    proc, _ = run_profile(tmp_path, THP_MODES.replace("host_changes = true\n", ""))
    assert proc.returncode == 2
    assert f"would change {knobs.THP_ENABLED}" in proc.stderr
    assert "--allow-host-changes" in proc.stderr
    assert not (tmp_path / "r" / "mmlab.sqlite").exists() or statuses(tmp_path / "r") == {}


needs_root = pytest.mark.skipif(not is_root() or not THP.exists(), reason="needs root and THP")


def start_thp_experiment(tmp_path: Path, **popen) -> tuple[subprocess.Popen, Path]:
    """The THP-modes profile, started in the background."""
    profile = tmp_path / "thp.toml"
    profile.write_text(THP_MODES)
    results = tmp_path / "r"
    proc = subprocess.Popen([*MMLAB, "experiment", "run", str(profile), "--results",
                             str(results)], **popen)
    return proc, results


@needs_root
def test_sigkill_loses_at_most_the_trial_in_flight_and_resume_finishes(tmp_path, stop_children):
    before = THP.read_text()
    proc, results = start_thp_experiment(tmp_path, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True)
    stop_children.append(proc)
    wait_done(results, 3)
    os.killpg(proc.pid, signal.SIGKILL)          # mmlab and its mmwork, no cleanup at all
    proc.wait()
    left_changed = THP.read_text() != before      # killed inside a trial, or between two
    after_kill = statuses(results)
    assert after_kill.get("done", 0) >= 3 and after_kill.get("failed", 0) == 0
    done_before = after_kill["done"]

    resumed = mmlab("experiment", "resume", "1", "--results", str(results))
    assert resumed.returncode == 0, resumed.stderr
    if left_changed:
        assert "an earlier run did not finish; restored" in resumed.stderr
    assert statuses(results) == {"done": 8}
    db = sqlite3.connect(results / "mmlab.sqlite")
    per_trial = db.execute("SELECT COUNT(*) FROM samples GROUP BY trial_id").fetchall()
    assert len(per_trial) == 8 and {n for (n,) in per_trial} == {1}   # none lost, none twice
    assert f"{done_before} already done" in resumed.stdout or \
        f"{8 - done_before} run now" in resumed.stdout
    assert THP.read_text() == before


@needs_root
def test_ctrl_c_replans_the_trial_and_restores_at_once(tmp_path, stop_children):
    before = THP.read_text()
    proc, results = start_thp_experiment(tmp_path, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True)
    stop_children.append(proc)
    wait_done(results, 2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "interrupted" in err
    st = statuses(results)
    assert st.get("running", 0) == 0 and st.get("failed", 0) == 0 and st["done"] >= 2
    assert THP.read_text() == before
    assert not knobs.journal_path().exists()


# ---------------------------------------------------------------- adaptive rounds (fake target)

ADAPTIVE = """\
name = "adaptive"
workload = "pageout-refault"
repetitions = 12
max_repetitions = 25
metrics = ["cycle_ns_per_page", "advise_ns_per_page"]
baseline = "A"
seed = 4

[params]
mapping-kb = 1024

[[arms]]
name = "A"

[[arms]]
name = "B"

[[arms]]
name = "C"
"""


def adaptive_run(tmp_path, fake: FakeTarget, text: str = ADAPTIVE):
    plan = parse(text, "adaptive.toml")
    store = Store(tmp_path / "r")
    exp_id = store.create_experiment(plan)
    looks = []
    result = runner.run(store, exp_id, plan, fake_pool(fake),
                        lambda e: looks.append(e.judgement) if isinstance(e, Looked) else None)
    return store, exp_id, plan, result, looks


def rounds_of(store: Store, exp_id: int) -> list[int]:
    return [t.round for t in store.trials(exp_id)]


def test_a_clear_answer_stops_at_the_minimum(tmp_path):
    store, exp_id, plan, result, looks = adaptive_run(tmp_path, FakeTarget({"C": 1.3}, cv=0.005))
    assert (result.rounds, result.added, len(looks)) == (12, 0, 1)
    assert result.stopped == "every judged pair is decided"
    judged = verdicts.judge(store.plan(exp_id), store.measurements(exp_id))
    by = {(c.arm, c.metric): c for c in judged.comparisons}
    assert {c.verdict for (arm, _), c in by.items() if arm == "C"} == {"regression"}
    assert {c.verdict for (arm, _), c in by.items() if arm == "B"} == {"no change"}
    for c in judged.comparisons:
        assert (c.rounds, c.look, c.looks, c.method) == (12, 1, 3, "paired-wilcoxon")
        assert c.stopped == "decided at look 1 of 3 (12 rounds)"
        assert c.correction == "Holm over 4 tests" and c.p_adjusted >= c.p_value


def test_rounds_are_added_at_the_planned_looks_until_the_maximum(tmp_path):
    store, exp_id, plan, result, looks = adaptive_run(tmp_path, FakeTarget(cv=0.3))
    assert [j.rounds for j in looks] == [12, 18, 25]
    assert [j.next_rounds for j in looks] == [18, 25, None]
    assert (result.rounds, result.added) == (25, 13)
    assert result.stopped == "the maximum of 25 rounds was reached"
    # the extended plan is the plan the seed would have drawn whole, every arm once a round
    assert store.plan(exp_id).order == schedule(["A", "B", "C"], 25, 4)
    assert rounds_of(store, exp_id) == sorted(rounds_of(store, exp_id))
    judged = verdicts.judge(store.plan(exp_id), store.measurements(exp_id))
    assert {c.verdict for c in judged.comparisons} == {"unreliable"}
    assert all(c.stopped == result.stopped and c.rounds == 25 for c in judged.comparisons)


def test_the_time_budget_stops_adding_rounds(tmp_path):
    text = ADAPTIVE.replace("seed = 4", "seed = 4\nbudget_s = 0.000001")
    store, exp_id, plan, result, looks = adaptive_run(tmp_path, FakeTarget(cv=0.3), text)
    assert (result.rounds, result.added) == (12, 0)
    assert result.stopped.startswith("the time budget of 0 s ran out")
    judged = verdicts.judge(store.plan(exp_id), store.measurements(exp_id))
    assert judged.next_rounds is None and judged.stopped == result.stopped


class Interrupting(FakeTarget):
    """Ctrl-C during the trial number `at` (counted from 1)."""

    def __init__(self, at: int, **kw):
        super().__init__(**kw)
        self.at = at

    def run_trial(self, arm, plan):
        if len(self.trials) + 1 == self.at:
            self.trials.append(arm.name)
            raise Interrupted
        return super().run_trial(arm, plan)


def test_ctrl_c_in_added_rounds_resumes_from_the_store(tmp_path):
    plan = parse(ADAPTIVE, "adaptive.toml")
    store = Store(tmp_path / "r")
    exp_id = store.create_experiment(plan)
    with pytest.raises(Interrupted):            # in round 14, after the first look added rounds
        runner.run(store, exp_id, plan, fake_pool(Interrupting(41, cv=0.3)))
    st = {t.status for t in store.trials(exp_id)}
    assert st == {"done", "planned"} and len(store.trials(exp_id)) == 18 * 3
    assert store.measurements(exp_id).pending == 54 - 40
    judged = verdicts.judge(store.plan(exp_id), store.measurements(exp_id))
    assert judged.next_rounds is None and "planned trials not run yet" in judged.stopped
    resumed = runner.run(store, exp_id, store.plan(exp_id), fake_pool(FakeTarget(cv=0.3, seed=2)))
    assert (resumed.skipped, resumed.rounds) == (40, 25)
    trials = store.trials(exp_id)
    assert len(trials) == 75 and {t.status for t in trials} == {"done"}
    assert store.plan(exp_id).order == schedule(["A", "B", "C"], 25, 4)


def test_limits_from_the_command_line_are_stored_and_checked(tmp_path):
    plan = parse(ADAPTIVE, "adaptive.toml")
    wider = with_limits(plan, max_repetitions=40, budget_s=60)
    assert (wider.profile.max_repetitions, wider.profile.budget_s) == (40, 60)
    with pytest.raises(MmlabError, match="below repetitions"):
        with_limits(plan, max_repetitions=5)
    store = Store(tmp_path / "r")
    exp_id = store.create_experiment(plan)
    assert store.set_limits(exp_id, max_repetitions=30).profile.max_repetitions == 30
    assert store.plan(exp_id).profile.max_repetitions == 30
    assert store.plan(exp_id).profile.budget_s is None


def test_samples_of_one_trial_count_once(tmp_path):
    """samples_per_trial = 3: the paired analysis sees one value per trial."""
    text = ADAPTIVE.replace("repetitions = 12\nmax_repetitions = 25",
                            "repetitions = 8\nsamples_per_trial = 3")
    store, exp_id, plan, result, _ = adaptive_run(tmp_path, FakeTarget({"C": 1.3}), text)
    m = store.measurements(exp_id)
    assert sum(len(t.samples) for t in m.trials) == 72
    assert len(m.observations("C", "cycle_ns_per_page").values) == 8
    judged = verdicts.judge(plan, m)
    assert {(c.n, c.n_baseline) for c in judged.comparisons} == {(8, 8)}
    assert store.samples_by_arm(exp_id)["C"] == m.by_arm["C"]


class FailingSome(FakeTarget):
    """Arm B's trials of the rounds in `rounds` fail."""

    def __init__(self, rounds: set[int], **kw):
        super().__init__(**kw)
        self.fail_rounds = rounds

    def run_trial(self, arm, plan):
        if arm.name == "B" and self.trials.count("B") in self.fail_rounds:
            self.trials.append(arm.name)
            raise TrialError("B: failed on purpose", {})
        return super().run_trial(arm, plan)


def test_failed_trials_pair_the_complete_rounds_or_fall_back_to_unpaired(tmp_path):
    store, exp_id, plan, result, _ = adaptive_run(tmp_path, FailingSome({2, 5}, cv=0.005,
                                                                      factors={"C": 1.3}))
    assert result.failed == 2
    judged = verdicts.judge(plan, store.measurements(exp_id))
    b = [c for c in judged.comparisons if c.arm == "B"]
    assert {(c.method, c.n) for c in b} == {("paired-wilcoxon", 10)}      # 12 rounds, 2 failed
    text = ADAPTIVE.replace("repetitions = 12\nmax_repetitions = 25", "repetitions = 7")
    store, exp_id, plan, result, _ = adaptive_run(tmp_path / "few", FailingSome({2, 5}), text)
    judged = verdicts.judge(plan, store.measurements(exp_id))
    assert {(c.method, c.n, c.n_baseline) for c in judged.comparisons if c.arm == "B"} \
        == {("unpaired", 5, 7)}                                          # 5 complete: too few


class Ordered(FakeTarget):
    """Noise that follows the schedule: the first trial of every round `first`
    times the others, and the trial run just after arm `after` `carry` times."""

    def __init__(self, first: float = 1.0, after: str | None = None, carry: float = 1.0, **kw):
        super().__init__(**kw)
        self.first, self.after, self.carry = first, after, carry

    def run_trial(self, arm, plan):
        slot = len(self.trials) % len(plan.arms)
        before = self.trials[-1] if slot else None
        self.factors = {arm.name: (self.first if slot == 0 else 1.0)
                        * (self.carry if before == self.after else 1.0)}
        return super().run_trial(arm, plan)


def test_order_effects_in_the_run_are_named_on_the_comparisons_they_touch(tmp_path):
    """First in round 8 % slower: balanced by the schedule, so B and C stay "no
    change" against A, and the effect is named on every comparison.  The trial
    after C 8 % slower: named on C's comparisons only.  None without either."""
    _, _, _, first, _ = adaptive_run(tmp_path / "first", Ordered(first=1.08, cv=0.01))
    for c in first.judgement.comparisons:
        assert c.verdict == "no change", c
        (effect,) = c.order_effects
        assert effect.kind == "first in round" and effect.low < 1.08 < effect.high
    assert "order effects found (balanced by the schedule): first in round x1.0" in \
        "\n".join(experiment.reasons(first.judgement.comparisons))
    _, _, _, carry, _ = adaptive_run(tmp_path / "carry", Ordered(after="C", carry=1.08, cv=0.01))
    named = {c.arm: [str(e) for e in c.order_effects] for c in carry.judgement.comparisons}
    assert named["B"] == [] and all(e.startswith("after C x1.0") for e in named["C"])
    _, _, _, plain, _ = adaptive_run(tmp_path / "plain", FakeTarget(cv=0.01))
    assert all(c.order_effects == () for c in plain.judgement.comparisons)


# ------------------------------------------------- trials side by side
#
# A target that says its trials may run two at a time (a counts-only plan in
# TCG guests) gets them two at a time, each committed on the runner's thread.

class SideBySide(FakeTarget):
    """Each trial waits at a barrier for a second one: run one at a time,
    the barrier breaks and the trial raises."""

    def __init__(self, width: int = 2, **kw):
        super().__init__(**kw)
        self.width = width
        self.barrier = threading.Barrier(width, timeout=10)
        self.stopped = threading.Event()

    def side_by_side(self, plan):
        return self.width

    def stop(self):
        self.stopped.set()

    def run_trial(self, arm, plan):
        self.barrier.wait()
        return super().run_trial(arm, plan)


def test_trials_a_target_allows_side_by_side_run_two_at_a_time(tmp_path):
    plan, store, exp_id = quick_experiment(tmp_path)
    fake = SideBySide(fail={"big"})
    result = runner.run(store, exp_id, plan, fake_pool(fake), with_controls=False)
    assert (result.done, result.failed) == (3, 3) and len(fake.trials) == 6
    trials = store.trials(exp_id)
    assert {t.status for t in trials if store.plan(exp_id).arm(t.arm).name == "big"} == {"failed"}
    assert sum(len(v) for v in store.samples_by_arm(exp_id).values()) == 3


class CountedBeside(FakeTarget):
    """Trials split as a TCG guest's timed-and-counted trials are: a timed
    pass that fails if any counting pass runs beside it, and a counting
    pass that waits at a barrier of `parties` (with two, run one at a time,
    the barrier breaks)."""

    def __init__(self, parties: int = 2, **kw):
        super().__init__(**kw)
        self.barrier = threading.Barrier(parties, timeout=10)
        self.lock = threading.Lock()
        self.counting = 0
        self.order: list[str] = []

    def counting_side_by_side(self, plan):
        return 2

    def timed_pass(self, arm, plan):
        with self.lock:
            assert self.counting == 0, "a timed pass ran beside a counting pass"
            self.order.append("T")
        result = self.run_trial(arm, plan)

        def counting_pass():
            with self.lock:
                self.counting += 1
                self.order.append("C")
            try:
                self.barrier.wait()
            finally:
                with self.lock:
                    self.counting -= 1
            return result
        return counting_pass


def test_counting_passes_run_two_at_a_time_after_their_timed_passes_ran_alone(tmp_path):
    plan, store, exp_id = quick_experiment(tmp_path)
    fake = CountedBeside()
    result = runner.run(store, exp_id, plan, fake_pool(fake), with_controls=False)
    assert (result.done, result.failed) == (6, 0)
    assert fake.order == ["T", "T", "C", "C"] * 3


def test_a_timed_pass_that_fails_fails_its_trial_and_runs_no_counting_pass(tmp_path):
    plan, store, exp_id = quick_experiment(tmp_path)
    fake = CountedBeside(parties=1, fail={"big"})
    result = runner.run(store, exp_id, plan, fake_pool(fake), with_controls=False)
    assert (result.done, result.failed) == (3, 3)
    assert fake.order.count("C") == 3 and fake.order.count("T") == 6
    assert sum(len(v) for v in store.samples_by_arm(exp_id).values()) == 3


class InterruptedTimed(CountedBeside):
    """Ctrl-C during the third timed pass."""

    def timed_pass(self, arm, plan):
        if self.order.count("T") == 2:
            raise Interrupted
        return super().timed_pass(arm, plan)


def test_ctrl_c_in_a_timed_pass_replans_every_trial_not_committed(tmp_path):
    plan, store, exp_id = quick_experiment(tmp_path)
    with pytest.raises(Interrupted):
        runner.run(store, exp_id, plan, fake_pool(InterruptedTimed()), with_controls=False)
    statuses = [t.status for t in store.trials(exp_id)]
    assert statuses.count("done") == 2 and statuses.count("planned") == 4


class AttributedBeside(FakeTarget):
    """Each arm's attribution waits at a barrier for the other's: run one
    at a time, the barrier breaks; `failing` arms fail theirs."""

    def __init__(self, failing=frozenset()):
        super().__init__()
        self.barrier = threading.Barrier(2, timeout=10)
        self.failing = failing

    def attribution_side_by_side(self, plan):
        return 2

    def attribute(self, arm, plan):
        self.barrier.wait()
        if arm.name in self.failing:
            raise MmlabError("no plugin")
        return {"functions": {"arm": arm.name}}


def test_attribution_runs_two_arms_at_once_where_the_target_allows(tmp_path):
    plan, store, exp_id = quick_experiment(tmp_path)
    said = []
    assert runner.attribute(store, exp_id, plan, fake_pool(AttributedBeside({"big"})),
                            lambda e: said.append(getattr(e, "text", ""))) == 1
    assert store.attributions(exp_id) == {"small": {"functions": {"arm": "small"}}}
    assert "attribution: big failed: no plugin" in said


class BlockedBeside(FakeTarget):
    """Two trials side by side, then two that wait until `stop` ends them."""

    def __init__(self):
        super().__init__()
        self.stopped = threading.Event()
        self.blocked = threading.Semaphore(0)
        self.lock = threading.Lock()
        self.started = 0

    def side_by_side(self, plan):
        return 2

    def stop(self):
        self.stopped.set()

    def run_trial(self, arm, plan):
        with self.lock:
            self.started += 1
            n = self.started
        if n > 2:
            self.blocked.release()
            self.stopped.wait(10)
            raise TrialError("guest killed", {})
        return super().run_trial(arm, plan)


def _interrupt(_signo, _frame):
    raise Interrupted


def test_ctrl_c_ends_the_trials_beside_each_other_and_replans_them(tmp_path):
    plan, store, exp_id = quick_experiment(tmp_path)
    fake = BlockedBeside()

    def ctrl_c_once_two_wait():
        for _ in range(2):
            fake.blocked.acquire(timeout=10)
        os.kill(os.getpid(), signal.SIGINT)

    before = signal.signal(signal.SIGINT, _interrupt)
    try:
        threading.Thread(target=ctrl_c_once_two_wait, daemon=True).start()
        with pytest.raises(Interrupted):
            runner.run(store, exp_id, plan, fake_pool(fake), with_controls=False)
    finally:
        signal.signal(signal.SIGINT, before)
    assert fake.stopped.is_set()
    statuses = [t.status for t in store.trials(exp_id)]
    assert statuses.count("done") == 2 and statuses.count("planned") == 4
