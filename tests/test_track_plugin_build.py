"""Counts of two builds of mmlab's TCG plugin are never compared: each
counted sample records the build that counted it, a pair whose two sides
were counted by different builds is not comparable (the plugin's change
moves its counts as a kernel's would: interrupts taken out of the
functions they landed in), and a step between cells of different builds
is decided by its confirmation, which measures both releases with one."""

from __future__ import annotations

from pathlib import Path

from mmlab.judge.comparison import Comparison
from mmlab.judge.criteria import Verdict
from mmlab.kernels import qemu_plugin
from mmlab.report import text
from mmlab.run import driver
from mmlab.store import Store
from mmlab.targets import TargetPool
from mmlab.track import changepoints, session, suite
from mmlab.track.judged import Judgements
from mmlab.workloads import insns
from mmlab.workloads.samples import Sample

from .fake_target import RUSAGE
from .test_count_rule import PROFILE, SUITE, SYSCALL, Stays
from .test_insns import pageout, record
from .test_track import Local, write_suite
from .test_track_series import READLINK

PLUGIN = "qemu tcg plugin, separate counting pass"


class Rebuilt(Stays):
    """Stays, counted by the plugin: kernels in `new` by a build that takes
    the interrupts out of madvise's path (1% of it), and naming itself;
    the others by the build before, which named none."""

    def __init__(self, new: set[str], **kw):
        super().__init__(**kw)
        self.new = new

    def run_trial(self, arm, plan):
        result = super().run_trial(arm, plan)
        for s in result.samples:
            s.state[insns.SOURCE_KEY] = PLUGIN
            if arm.kernel in self.new:
                s.state[insns.PLUGIN_KEY] = "insns-0123456789abcdef"
                s.metrics[SYSCALL] /= 1.01
        return result


def tracked(tmp_path: Path, fake: Stays, store: Store | None = None):
    found = suite.load(write_suite(tmp_path, SUITE, PROFILE))
    store = store or Store(tmp_path / "r")
    return store, session.run(store, found, driver.Here(TargetPool(make=lambda arm: fake)),
                              Local())


def confirmed(result) -> set[tuple[str, str, str]]:
    return {(c.metric, c.before, c.after) for c in result.changes if c.confirmed}


def test_a_pair_counted_by_two_builds_is_never_a_change(tmp_path):
    """local:e counted by the new build, its reference and neighbours by the
    old (a fleet's workers with different plugins, or a block resumed
    after the plugin changed): its cell's -1% on madvise's path was a
    candidate, and its confirmation against local:d, each side of one
    build, made it a confirmed improvement.  Now e's cell is no point of a
    count's series, and the tracker says why of the pair."""
    store, result = tracked(tmp_path, Rebuilt({"local:e"}, cv=0.0002))
    assert (SYSCALL, "local:d", "local:e") not in confirmed(result)
    assert (SYSCALL, "local:b", "local:c") in confirmed(result)      # the kernel's own step
    (series,) = [s for s in result.series if s.metric == SYSCALL]
    assert "local:e" not in [p.release.name for p in series.points]
    judged = Judgements(store)
    cells = [i for i in range(1, 1 + len(store.experiments()))
             if "local:e" in {a.kernel for a in store.plan(i).arms}]
    across = [c for i in cells for c in judged.comparisons(i)[1]
              if c.metric == SYSCALL and "local:e" in c.arm]
    assert across and all(changepoints.outcome_of(SYSCALL, c) == changepoints.ACROSS_BUILDS
                          for c in across)
    assert all(c.reason.startswith("counted by different plugin builds (one that recorded "
                                   "none, insns-0123456789abcdef): counted") for c in across)


class Resumed(Rebuilt):
    """Rebuilt, whose confirmations count local:c with the new build (one
    resumed after the plugin changed, its arms' trials on either side)."""

    def run_trial(self, arm, plan):
        self.new = {"local:c"} if plan.profile.derived.startswith("track-confirm") else set()
        return super().run_trial(arm, plan)


def test_a_confirmation_two_builds_counted_is_not_comparable_and_tallied(tmp_path):
    """madvise's path steps +0.4% at local:c; the confirmation of b..c
    counted c by the build that takes 1% out: it was a confirmed -0.6%
    improvement.  Now it is not comparable, said and counted as such."""
    _, result = tracked(tmp_path, Resumed(set(), cv=0.0002))
    (change,) = [c for c in result.changes if c.metric == SYSCALL]
    assert (change.before, change.after) == ("local:b", "local:c")
    assert change.outcome == changepoints.ACROSS_BUILDS and not change.confirmed
    assert f"1 {changepoints.ACROSS_BUILDS}" in text.tally_line(result.changes)


def test_cells_of_a_store_from_before_and_new_cells_are_decided_by_one_build(tmp_path):
    """The store's cells from before (their samples name no build) and a
    later run's confirmation counted by the new build: the new build's 1%
    lower path is in none of the pairs judged, so no step is the plugin's."""
    store, _ = tracked(tmp_path, Rebuilt(set(), cv=0.0002))
    _, again = tracked(tmp_path, Rebuilt({f"local:{k}" for k in "abcde"}, cv=0.0002), store)
    assert {m for m, _, _ in confirmed(again)} <= {SYSCALL} and \
        (SYSCALL, "local:b", "local:c") in confirmed(again)


def sample(build: str | None, source: str = PLUGIN) -> Sample:
    state = {insns.SOURCE_KEY: source, **({insns.PLUGIN_KEY: build} if build else {})}
    return Sample(workload="pageout-refault", sample=0, mmwork_version="t", params={},
                  metrics={}, counts={}, rusage=RUSAGE, vmstat_delta={}, state=state, errors={})


def test_only_the_plugins_counts_name_a_build():
    assert changepoints.plugin_builds([sample("insns-a"), sample(None)]) == {"insns-a", ""}
    assert changepoints.plugin_builds([sample("insns-a"), sample(None, "perf, counting pass alone"),
                                       sample(None, "none (no QEMU plugin)")]) == {"insns-a"}


def test_one_build_on_both_sides_is_judged_as_before():
    c = Comparison(READLINK, "new", "old", 6, 6, 25_781.0, 24_317.0, 1.06, 1.06, 1.06, 0.0,
                   0.0, 0.0, 0.0, 0.0, Verdict.REGRESSION, "counted: medians +6.020%",
                   method="count rule (range separation)")
    time = Comparison(**{**c.__dict__, "metric": "command_ns_per_run"})
    same = {"new": [sample("insns-a")], "old": [sample("insns-a")]}
    assert changepoints.by_one_build([c, time], same) == [c, time]
    before = {"new": [sample(None)], "old": [sample(None)]}
    assert changepoints.by_one_build([c], before) == [c]
    two = {"new": [sample("insns-b")], "old": [sample("insns-a")]}
    judged, untouched = changepoints.by_one_build([c, time], two)
    assert judged.verdict == Verdict.NOT_COMPARABLE and untouched == time    # a time is no count
    assert changepoints.why(READLINK, judged, changepoints.outcome_of(READLINK, judged))


def test_a_counting_pass_records_its_build_in_the_samples_it_joins():
    """The plugin's .so is named by the QEMU version and its sources' hash;
    the timing samples a counting pass joins carry its build."""
    assert qemu_plugin.build(Path("/c/qemu-plugin/1_7.2/insns-0123456789abcdef.so")) == \
        "insns-0123456789abcdef"
    counted = [sample(None, "")]
    counted[0].counts.update({"advise_units": 100.0, "advise_windows": 4.0})
    insns.from_plugin(pageout(), counted, record("sample", (4, 4000, 80)), "insns-a")
    timed = [sample(None, "")]
    insns.join(timed, counted, pageout())
    assert timed[0].state[insns.PLUGIN_KEY] == "insns-a"
