"""The count rule: a counted metric is a change when its two sets of trials
are apart and its step is beyond both a few of its own robust CVs and the
floor of its kind of count (a whole command's 1 %, a syscall's path's
0.25 %), in `compare`'s verdicts as in the tracker; on synthetic sets,
through the judge, and in the tracker on the fake target, where a step in
one syscall's count that the whole command does not show is reported under
its profile."""

from __future__ import annotations

import numpy as np

from mmlab.experiment.plan import parse
from mmlab.judge import criteria, stats, verdicts
from mmlab.judge.criteria import HIGHER, LOWER, NO_CHANGE, UNDECIDED
from mmlab.run import driver
from mmlab.store import Store
from mmlab.targets import TargetPool
from mmlab.track import session, suite
from mmlab.workloads.samples import Sample

from .fake_target import RUSAGE
from .test_track import STEP_AT, Counting, Local, guest_pool, write_suite
from .test_track import PROFILE as TRACK_PROFILE
from .test_track import SUITE as TIMES_SUITE
from .test_verdicts import COUNTED

SYSCALL = "advise_syscall_madvise_kernel_insns_per_call"
WINDOW = "advise_kernel_insns_per_page"


def trials(centre: float, spread: float, n: int, seed: int) -> np.ndarray:
    return centre * np.random.default_rng(seed).lognormal(0, spread, n)


def rule(a, b, metric: str) -> int:
    """The count rule's outcome of arm `a` against baseline `b` as the judge
    applies it to `metric`."""
    sep = stats.separation(a, b)
    floor = criteria.COUNT_FLOORS[criteria.count_family(metric)]
    return int(criteria.count_outcomes(sep.step, sep.noise, sep.low, sep.high, floor)[0])


def test_the_floor_follows_the_kind_of_count():
    assert criteria.count_family("command_kernel_insns_per_run") == "window"
    assert criteria.count_family("post_touch_kernel_insns_per_page") == "window"
    assert criteria.count_family("fault_kernel_insns_per_page") == "window"    # window "fault"
    assert criteria.count_family("command_syscall_mprotect_kernel_insns_per_call") == "path"
    assert criteria.count_family("fault_fault_kernel_insns_per_page") == "path"
    assert criteria.count_family("command_syscall_mprotect_calls") == "calls"
    assert criteria.COUNT_FLOORS["path"] < 0.004 < criteria.COUNT_FLOORS["window"]


def test_a_small_step_in_a_syscall_is_a_change_and_in_a_whole_command_none():
    """+0.4% at 0.02% spread, four trials a side (a count cell): ten times
    its noise.  A syscall's path (floor 0.25%) changed; the same step in a
    whole command is inside its 1% floor, every trial within it of every
    other: no change, as the tracker said of it before."""
    b, a = trials(17_700, 0.0002, 4, 1), trials(17_700 * 1.004, 0.0002, 4, 2)
    assert rule(a, b, SYSCALL) == HIGHER and rule(b, a, SYSCALL) == LOWER
    assert rule(a, b, WINDOW) == NO_CHANGE
    below = trials(17_700 * 1.001, 0.0002, 4, 3)           # well under the syscall's floor
    assert rule(below, b, SYSCALL) == NO_CHANGE


def test_a_step_within_its_own_noise_or_with_overlapping_sets_is_undecided():
    """A short syscall's count whose calls timer ticks land in (2% spread):
    a 1% step is within 3 robust CVs, so neither a change nor the same;
    one trial of the arm among the baseline's keeps the sets from parting."""
    b, a = trials(900, 0.02, 6, 4), trials(909, 0.02, 6, 5)
    assert rule(a, b, SYSCALL) == UNDECIDED
    b = np.array([1000.0, 1000.1, 999.9, 1000.05])
    a = np.array([1010.0, 1010.1, 1000.0, 1010.05])
    assert rule(a, b, SYSCALL) == UNDECIDED


def test_zero_steps_give_no_change_at_the_spreads_counts_have():
    """A/A pairs at the spreads measured (0.01-0.05% for a whole command, up
    to 2% for a short syscall) and near each floor, where the rule is
    weakest: false changes in under 1% of pairs of a count cell's 4 trials a
    side, and under 0.1% of a confirmation's 6 (a time's verdict allows
    alpha, 5%)."""
    rng = np.random.default_rng(7)
    for n, bound in ((4, 0.01), (6, 0.001)):
        for spread in (0.0001, 0.0005, 0.001, 0.003, 0.02):
            for metric in (SYSCALL, WINDOW, "command_syscall_mprotect_calls"):
                a, b = (np.exp(rng.normal(0, spread, (20_000, n))) for _ in range(2))
                sep = stats.separation(a, b)
                floor = criteria.COUNT_FLOORS[criteria.count_family(metric)]
                found = criteria.count_outcomes(sep.step, sep.noise, sep.low, sep.high, floor)
                assert np.isin(found, (HIGHER, LOWER)).mean() <= bound, (n, spread, metric)


def test_the_judge_takes_counts_out_of_the_family_and_decides_them_by_the_rule():
    """Plain samples of two arms, a count and a time: the count's verdict is
    the rule's (its reason says counted), not the rank test's, and the
    time's p is not corrected for it."""
    plan = parse(COUNTED.format(rounds=6).replace('"post_touch_kernel_insns_per_page"',
                                                  '"advise_ns_per_page"'), "mixed.toml")
    base, arm = (a.name for a in plan.arms)

    def samples(insns: np.ndarray, ns: np.ndarray) -> list[Sample]:
        return [Sample(workload="pageout-refault", sample=0, mmwork_version="t", params={},
                       metrics={WINDOW: float(i), "advise_ns_per_page": float(t)}, counts={},
                       rusage=RUSAGE, vmstat_delta={}, state={}, errors={})
                for i, t in zip(insns, ns)]
    judged = verdicts.judge(plan, {
        base: samples(trials(1000, 0.0005, 6, 1), trials(50, 0.1, 6, 2)),
        arm: samples(trials(1006, 0.0005, 6, 3), trials(50, 0.1, 6, 4))})
    by = {c.metric: c for c in judged.comparisons}
    assert by[WINDOW].method.startswith("count rule") and by[WINDOW].reason.startswith("counted")
    assert by[WINDOW].verdict == "no change"           # +0.6% is inside a window's 1% floor
    assert by["advise_ns_per_page"].correction == ""   # a family of one


# test_track's profile and suite, measuring a window's count and a stay's calls.
COUNTED_METRICS = 'metrics = ["advise_kernel_insns_per_page", "advise_syscall_madvise_calls"]'
PROFILE = TRACK_PROFILE.replace(
    'metrics = ["advise_ns_per_page", "advise_kernel_insns_per_page"]', COUNTED_METRICS)
SUITE = TIMES_SUITE.replace(
    'metrics = ["advise_ns_per_page", "advise_kernel_insns_per_page", "cycle_ns_per_page"]',
    COUNTED_METRICS)


class Stays(Counting):
    """The fake, whose counting passes also count each syscall and fault of
    the advise window, as the plugin's stays do where a profile names one:
    from local:c on, madvise's path runs +0.4% (0.02% spread) while the
    window as a whole moves +0.04%; mprotect is made by local:a alone."""

    def run_trial(self, arm, plan):
        result = super().run_trial(arm, plan)
        step = arm.kernel in STEP_AT
        for s in result.samples:
            noise = float(self.rng.lognormal(0, 0.0002))
            s.metrics[WINDOW] = 17_700.0 * (1.0004 if step else 1.0) * noise
            s.metrics["advise_syscall_madvise_calls"] = 1.0
            s.metrics[SYSCALL] = 1_800.0 * (1.004 if step else 1.0) * noise
            s.metrics["advise_fault_kernel_insns_per_call"] = 2_400.0 * noise
            if arm.kernel == "local:a":
                s.metrics["advise_syscall_mprotect_kernel_insns_per_call"] = 900.0 * noise
        return result


def test_a_step_in_one_syscall_the_whole_window_hides_is_reported_under_its_profile(tmp_path):
    """The suite keeps a stay it names (which has the plugin count them all),
    and the tracker follows every stay series its cells stored, not only
    the profile's metrics: madvise's count per call steps +0.4% at local:c and
    is confirmed there (a syscall's floor is 0.25%), where the window's
    +0.04% is no change; a syscall one release never made is no series of
    a change; the run lists the profile's changes largest first."""
    found = suite.load(write_suite(tmp_path, SUITE, PROFILE))
    assert found.profiles[0].metrics == [WINDOW, "advise_syscall_madvise_calls"]  # a stay kept
    store = Store(tmp_path / "r")
    fake = Stays(cv=0.0002)
    result = session.run(store, found, driver.Here(TargetPool(make=lambda arm: fake)), Local())
    followed = {s.metric for s in result.series}
    assert {SYSCALL, "advise_fault_kernel_insns_per_call", WINDOW} <= followed
    confirmed = [(c.profile, c.metric, c.before, c.after) for c in result.changes if c.confirmed]
    assert ("pageout", SYSCALL, "local:b", "local:c") in confirmed
    assert not [m for _, m, _, _ in confirmed if m in (WINDOW, "advise_fault_kernel_insns_per_"
                                                       "call", "advise_syscall_madvise_calls")]
    sizes = [abs(np.log(session.size(c))) for c in result.changes]
    assert sizes == sorted(sizes, reverse=True)


def test_a_time_only_profiles_emulated_step_is_confirmed_on_its_counts(tmp_path):
    """A reporter's profile of times alone, in a TCG guest: its emulated
    time step is decided on counts without being asked; the pair's counts
    changed and no count series of its own reports them, so the step is a
    regression, its evidence the count confirmation."""
    times_only = TIMES_SUITE.replace('"advise_kernel_insns_per_page", ', "")
    found = suite.load(write_suite(tmp_path, times_only))
    store = Store(tmp_path / "r")
    pool, _ = guest_pool(counted=True)
    result = session.run(store, found, driver.Here(pool), Local())
    assert {(c.metric, c.outcome, c.emulated) for c in result.changes} == {
        ("advise_ns_per_page", "regression", True), ("cycle_ns_per_page", "regression", True)}
    (counts,) = result.confirmations
    assert all(c.evidence == counts and c.confirmation is None for c in result.changes)
    assert WINDOW in store.plan(counts).profile.metrics


def test_every_count_is_known_as_one_by_its_name_alone():
    """One reading of a metric's name serves the tracker, the judge's floors
    and the states audit: instructions, events and a stay's calls are counts
    (an event is no time), a stay's events have a path's floor, and a time
    is none.  Interrupt stays follow the host's clock: the audit skips them."""
    from mmlab.judge import audit
    from mmlab.judge.criteria import count_family
    from mmlab.workloads import is_count
    counts = ["command_kernel_insns_per_run", "walk_kernel_insns_per_migrated_page",
              "command_kernel_ipis_per_run", "command_user_retired_insns_per_run",
              "command_syscall_mprotect_calls", "advise_fault_calls",
              "command_syscall_mprotect_kernel_loads_per_call"]
    assert all(map(is_count, counts))
    assert not any(map(is_count, ["advise_ns_per_page", "command_units", "fault_calls",
                                  "cycle_ns_per_page"]))
    assert [count_family(m) for m in counts[2:]] == ["window", "window", "calls", "calls",
                                                      "path"]
    from mmlab.track import changepoints
    assert changepoints.is_count is is_count
    from .test_guest_states import _sample
    boots = [_sample(v, b, m) for m in ("command_interrupt_kernel_insns_per_call",
                       "command_syscall_wait4_calls")
             for b, v in (("0:a", 1000.0), ("0:a", 1000.5), ("1:b", 2000.0), ("1:b", 2000.5))]
    (f,) = audit.states_differ("x", boots)
    assert "wait4" in str(f) and "interrupt" not in str(f)


def test_the_tracker_follows_a_stay_that_holds_a_share_of_its_window():
    """A stay holding 2% of its window's kernel instructions is followed (its
    calls and instructions per call); one of 0.001% (a C library's start-up
    call) is not, however exactly it moves; named in the profile, it would be."""
    from types import SimpleNamespace

    from mmlab.track import judged

    from .test_guest_states import _sample
    plan = parse(PROFILE, "p.toml")
    figures = {"advise_kernel_insns_per_page": 1e6,
               **{f"advise_syscall_{name}_{figure}": value
                  for name, per_page in (("madvise", 2e4), ("getpid", 10.0))
                  for figure, value in (("calls", 1.0), ("kernel_insns_per_call", per_page),
                                        ("kernel_insns_per_page", per_page))}}
    samples = [_sample(0, "") for _ in range(2)]
    for s in samples:
        s.metrics.update(figures)
    measured = SimpleNamespace(trials=[SimpleNamespace(samples=samples)])
    followed = judged.followed(plan, measured)
    assert "advise_syscall_madvise_kernel_insns_per_call" in followed
    assert not [m for m in followed if "getpid" in m]
