"""One `mmlab track run` (or, measuring nothing, what `track report`
reads): every missing cell measured, change points found over every
series and each candidate confirmed by measuring its two releases against
each other (narrow.pair_experiment, with adaptive looks until decided).

A confirmation measures one class of metric: instruction counts in trials
that run the counting pass alone, 6 rounds and one look (counts vary under
0.3 % and are judged by magnitude, changepoints.outcome_of: no sequential
test to feed), or times in trials with no counting pass, with looks at 12,
18 and 25 rounds until the verdict decides.  A candidate in a count
series never pays for the rounds times need, nor a time candidate for
counting passes; a release pair with candidates of both classes gets one
confirmation of each.

A time step measured in a TCG guest is emulated time, which can point the
other way from hardware time; instruction counts are exact there.  So the
pair's counts decide it (changepoints.emulated_outcome): their
confirmation is measured, and a time confirmation only where the run asks
for it (`confirm_emulated`, track run --confirm-emulated): confirming
emulated times cost most of a run and decided nothing the counts did not.
A profile of times alone has its pair's counts measured all the same
(`class_metrics`), and where they changed one way the step takes their
side; only a workload with no window to count leaves its emulated time
steps candidates unless asked.

Confirmations are experiments in the store like cells, keyed by the
change's series, class and release labels, so a confirmed change keeps its
verdict (and its stable ID) as new releases arrive, and a run with nothing
new measures nothing.  Each carries the label of the run that made it: a
run's confirmations are one Benjamini-Hochberg family, fixed once the run
ends.  Where the profile counts instructions, a confirmation that found a
change gets the attribution runs that count them by function, once per
release pair: the pair's other confirmation gets a copy of them.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace

from mmlab.errors import MmlabError
from mmlab.experiment.plan import Plan, with_kernels
from mmlab.judge.comparison import Comparison
from mmlab.run import driver, narrow
from mmlab.run.events import Message, OnEvent, Progressed, ignore
from mmlab.store import Store
from mmlab.track import cells, changepoints
from mmlab.track.cells import Failed, Judgements, Series
from mmlab.track.changepoints import Change, Thresholds
from mmlab.track.releases import Line, Release, Resolver, lines
from mmlab.track.spread import Fleet
from mmlab.track.suite import Suite, Tracked

# A confirmation's rounds by class of metric: adaptive looks until decided.
ROUNDS = {"counts": (6, 6), "times": (12, 25)}
CONFIRM = re.compile(r"^track-confirm (?P<suite>\S+) (?P<profile>\S+) (?P<digest>\S+) "
                     r"(?P<kind>\S+) (?P<cls>counts|times) (?P<before>\S+) (?P<after>\S+) "
                     r"run=(?P<run>\S+) "
                     r"(?P<bname>\S+) (?P<bversion>\S+) (?P<aname>\S+) (?P<aversion>[^\s;]+)")


@dataclass
class TrackResult:
    reference: Release
    lines: list[Line]
    measured: list[int]             # experiments of the cells measured (or finished) now
    cells: int                      # cells measured (or finished) now
    confirmations: list[int]        # confirmation experiments run now
    series: list[Series]
    changes: list[Change]
    judged: Judgements              # what was judged, for the changes' evidence
    failed: list[Failed]            # releases whose trials failed in what was run now


@dataclass(frozen=True)
class Stored:
    """A confirmation in the store."""
    experiment: int
    run: str
    releases: tuple[Release, Release]


@dataclass(frozen=True)
class Ask:
    """A confirmation to measure: the pair, of one class, of one profile."""
    tracked: Tracked
    key: tuple[str, ...]          # (profile, digest, kind, class, before, after labels)
    before: Release
    after: Release

    @property
    def cls(self) -> str:
        return self.key[3]

    @property
    def what(self) -> str:
        return (f"confirming {self.tracked.name} ({self.cls}): {self.after.name} against "
                f"{self.before.name}")


class Confirmations:
    """The suite's confirmations, found by their series and labels, run when
    missing (or unfinished) if measuring, judged once each."""

    def __init__(self, store: Store, suite: Suite, here: driver.Here, run: str, measure: bool,
                 prepare: Callable[[Release], None], judged: cells.Judgements,
                 on_event: OnEvent = ignore, confirm_emulated: bool = False):
        self.store, self.suite, self.here, self.run = store, suite, here, run
        self.measure, self.prepare, self.on_event = measure, prepare, on_event
        self.judged, self.confirm_emulated = judged, confirm_emulated
        self.found: dict[tuple[str, ...], Stored] = {}
        for exp_id, key in cells.derived(store):
            m = CONFIRM.match(key)
            if m and m["suite"] == suite.name:
                self.found[(m["profile"], m["digest"], m["kind"], m["cls"], m["before"],
                            m["after"])] = \
                    Stored(exp_id, m["run"], (Release(m["bname"], m["bversion"], m["before"]),
                                              Release(m["aname"], m["aversion"], m["after"])))
        self.ran: list[int] = []
        self.asked: dict[tuple[str, ...], Ask] | None = None     # while `wanted` asks

    def get(self, tracked: Tracked, kind: str, cls: str, before: Release,
            after: Release, measure: bool = True) -> Stored | None:
        """The pair's confirmation of class `cls` (metric_class): stored, or
        measured now (None when only reading, or only asking: `wanted`);
        `measure` False reads what is stored even in a run that measures."""
        ask = Ask(tracked, (tracked.name, cells.profile_digest(tracked), kind, cls, before.label,
                            after.label), before, after)
        have = self.found.get(ask.key)
        if not (self.measure and measure) or \
                (have and not cells.unfinished(self.store, have.experiment)):
            return have
        if self.asked is not None:
            self.asked.setdefault(ask.key, ask)
            return None
        self.prepare(before)
        self.prepare(after)
        if have:
            self.on_event(Message(f"{ask.what}: resumed (experiment {have.experiment})"))
            driver.run_experiment(self.store, have.experiment, self.here,
                                  on_event=self.on_event)
        else:
            exp_id, _ = narrow.pair_experiment(self.store, self._plan(ask), before.name,
                                               after.name, self._note(ask), self.here, ask.what,
                                               self.on_event)
            have = self._stored(ask, exp_id)
        self._finish(ask, have.experiment)
        return have

    def decide(self, tracked: Tracked, kind: str, metric: str, before: Release, after: Release,
               emulated: bool, t: Thresholds,
               measure: bool = True) -> tuple[Stored | None, Comparison | None, str]:
        """The confirmation that decides the pair on `metric`, its comparison
        and the tracker's outcome (`measure` as `get`).  An emulated time
        step (`emulated`: the pair's figures are a TCG guest's time) is
        decided by the pair's counts where the profile counts: their
        confirmation, and a time confirmation only where the run asks for
        it (`confirm_emulated`); where the counts alone decided, it is
        their confirmation."""
        if not emulated:
            got = self.get(tracked, kind, metric_class(metric), before, after, measure)
            c = self.comparison(got.experiment, metric) if got else None
            return got, c, changepoints.outcome_of(metric, c, t)
        counts = self.get(tracked, kind, "counts", before, after, measure) \
            if class_metrics(tracked, "counts") else None
        outcomes = self._outcomes(counts.experiment, t) if counts else []
        times = self.get(tracked, kind, "times", before, after,
                         measure and self.confirm_emulated)
        c = self.comparison(times.experiment, metric) if times else None
        outcome = changepoints.emulated_outcome(changepoints.outcome_of(metric, c, t),
                                                changepoints.counted(outcomes) if counts else None)
        if outcome == changepoints.COUNTS_CHANGED and \
                not any(map(changepoints.is_count, tracked.metrics)):
            # no count series of its own reports the counted change: the step takes its side
            outcome = changepoints.direction(outcomes) or outcome
        decided_by_counts = (changepoints.EMULATED_ONLY, changepoints.COUNTS_CHANGED,
                             *changepoints.CONFIRMED)
        return times or (counts if outcome in decided_by_counts else None), c, outcome

    def _outcomes(self, exp_id: int, t: Thresholds) -> list[str]:
        """The outcome of each metric a confirmation judged (its own, and the
        counts it followed), but one both kernels did not give (a syscall
        one of them never made)."""
        plan, comps = self.judged.comparisons(exp_id)
        found = [cells.kernel_comparison(plan, comps, m)
                 for m in [*plan.profile.metrics, *self.judged[exp_id].followed]]
        return [changepoints.outcome_of(c.metric, c, t) for c in found if c and c.method]

    def wanted(self, ask: Callable[[], object]) -> list[Ask]:
        """The confirmations `ask` (finding the changes of some series)
        would measure next, not measured: what a fleet runs at once."""
        self.asked = {}
        try:
            ask()
            return list(self.asked.values())
        finally:
            self.asked = None

    def on_fleet(self, fleet: Fleet, asks: list[Ask]) -> None:
        """`asks` measured over the fleet at once (Fleet.experiments), each
        the confirmation `get` would make here; the attribution runs here."""
        todo = [self.found[a.key].experiment if a.key in self.found else
                with_kernels(self._plan(a), [a.before.name, a.after.name], self._note(a))
                for a in asks]
        ids = fleet.experiments(
            todo, lambda i: self.on_event(Message(f"{asks[i].what} (on the fleet)")))
        for a, exp_id in zip(asks, ids):
            if a.key not in self.found:
                self._stored(a, exp_id)
            self._finish(a, exp_id)

    def _plan(self, ask: Ask) -> Plan:
        """A confirmation's plan before its two kernels: its class's
        metrics and rounds."""
        return cells.cell_plan(ask.tracked, *ROUNDS[ask.cls], "none",
                               class_metrics(ask.tracked, ask.cls))

    def _note(self, ask: Ask) -> str:
        """The stored key CONFIRM reads back."""
        b, a = ask.before, ask.after
        return (f"track-confirm {self.suite.name} {' '.join(ask.key)} run={self.run} "
                f"{b.name} {b.version} {a.name} {a.version}")

    def _stored(self, ask: Ask, exp_id: int) -> Stored:
        self.found[ask.key] = Stored(exp_id, self.run, (ask.before, ask.after))
        self.ran.append(exp_id)
        return self.found[ask.key]

    def _finish(self, ask: Ask, exp_id: int) -> None:
        """A confirmation just measured (or finished): judged afresh, and
        its instructions by function measured if it has none yet."""
        self.judged.forget(exp_id)
        if not self.store.attributions(exp_id):
            self._attribute(ask, exp_id)

    def comparison(self, exp_id: int, metric: str) -> Comparison | None:
        return cells.kernel_comparison(*self.judged.comparisons(exp_id), metric)

    def _attribute(self, ask: Ask, exp_id: int) -> None:
        """Instructions by function for both releases, where the profile
        counts them and the confirmation found a change in some metric:
        measured once per release pair, and copied from the pair's other
        confirmation when that one has them already.  Only the functions:
        a change's explanation shows them, and the guest's mm-path trace
        is what made the unmap path's attribution 58 s an arm here (the
        functions alone: 5 s)."""
        plan, comps = self.judged.comparisons(exp_id)
        if not any(map(changepoints.is_count, [*ask.tracked.metrics, *plan.profile.metrics])):
            return
        if not any(changepoints.outcome_of(c.metric, c) in changepoints.CONFIRMED for c in comps):
            return
        other = self._sibling(ask.key)
        have = self.store.attributions(other.experiment) if other else {}
        if not have:
            self.prepare(ask.before)           # measured here, wherever the trials ran
            self.prepare(ask.after)
            self.here.attribute(self.store, exp_id, only_functions(plan), self.on_event)
        for arm, kinds in have.items():
            for kind, data in kinds.items():
                self.store.save_attribution(exp_id, arm, kind, data)

    def _sibling(self, key: tuple[str, ...]) -> Stored | None:
        """The confirmation of the same release pair for the other class of
        metric (a key's fourth part is its class)."""
        return self.found.get((*key[:3], OTHER[key[3]], *key[4:]))

    def other(self, change: Change) -> int | None:
        """The experiment of the release pair's confirmation of the other
        class of metric than the change's evidence, if there is one: its
        evidence shows both."""
        key = next((k for k, s in self.found.items() if s.experiment == change.evidence), None)
        got = self._sibling(key) if key else None
        return got.experiment if got else None

    def tests(self) -> dict[changepoints.Test, tuple[str, Comparison]]:
        """Every time comparison of every stored confirmation, with its run:
        the runs' families (changepoints.family)."""
        out = {}
        for s in self.found.values():
            plan, comps = self.judged.comparisons(s.experiment)
            for metric in plan.profile.metrics:
                c = cells.kernel_comparison(plan, comps, metric)
                if c is not None and not changepoints.is_count(metric):
                    out[(s.experiment, metric)] = (s.run, c)
        return out


OTHER = {"counts": "times", "times": "counts"}


def only_functions(plan: Plan) -> Plan:
    """`plan` making the attribution runs of instructions by function only."""
    return plan.model_copy(update={"profile": plan.profile.model_copy(
        update={"attribution": ["functions"]})})


def class_metrics(tracked: Tracked, cls: str) -> list[str]:
    """What a confirmation of class `cls` measures: the profile's metrics
    of that class.  A profile that declares only times (as reporters write
    them) still has its emulated time steps decided on counts: each
    window's kernel instructions and its stays (the first window's page
    faults named, which has every syscall, fault and exception counted:
    judged.followed), in a guest where the plugin counts them."""
    mine = [m for m in tracked.metrics if metric_class(m) == cls]
    windows = tracked.plan.workload.windows
    if mine or cls == "times" or not windows:
        return mine
    return [*(w.kernel_metric for w in windows), f"{windows[0].name}_fault_calls"]


def metric_class(metric: str) -> str:
    """A tracked metric's class: instruction counts or times."""
    return "counts" if changepoints.is_count(metric) else "times"


def run(store: Store, suite: Suite, here: driver.Here, resolver: Resolver,
        on_event: OnEvent = ignore, t: Thresholds = Thresholds(), measure: bool = True,
        fleet: Fleet | None = None, confirm_emulated: bool = False) -> TrackResult:
    """Measure what is missing and confirm the changes, series by series
    (across releases first, then each branch), so a run stopped among a
    branch's cells has already confirmed the series before it; with
    `measure` False only what is stored is read (a report): candidates
    without a stored confirmation stay candidates, and a store with no
    cell of the suite is refused (a report of nothing).  `on_event` hears each
    cell as it starts (Progressed) and the runs here (of a cell or a
    confirmation); `fleet` runs the cells and the confirmations' trials
    instead of `here` (the attribution runs stay here);
    `confirm_emulated` confirms emulated time steps in time too.  A line's
    changes are found once all its confirmations are stored (`_confirm`),
    so a run lists what a report of the store lists."""
    cells.check_owner(store, suite)
    if not measure and not cells.stored(store, suite):
        raise MmlabError(f"--results {store.where}: nothing measured for suite {suite.name} "
                         "(no cell of its profiles as they are now): run mmlab track run "
                         f"{suite.path} first")
    ref = cells.reference(store, suite, resolver)
    found_lines = lines(suite, resolver, ref, cells.remembered(store, suite, ref))
    work = cells.pending(store, suite, cells.planned(suite, found_lines, ref)) if measure else []
    judged = cells.Judgements(store)
    conf = Confirmations(store, suite, here, secrets.token_hex(4), measure, resolver.prepare,
                         judged, on_event, confirm_emulated)
    measured: list[int] = []
    counted = 0
    found: list[cells.Series] = []
    changes: list[Change] = []
    for line in found_lines:
        mine = {c.ident for _, c in cells.planned(suite, [line], ref)}
        todo = [w for w in work if w[1].ident in mine]
        work = [w for w in work if w[1].ident not in mine]
        measured += _measure(store, todo, here, resolver, on_event, fleet, counted,
                             counted + len(todo) + len(work))
        counted += len(todo)
        line_series = cells.series(store, suite, [line], ref, judged)
        found += line_series
        if measure:
            _confirm(suite, line_series, conf, t, fleet)
        changes += [ch for s in line_series for ch in _changes(suite, s, conf, t)]
    changes = [replace(c, also=conf.other(c)) if c.evidence is not None else c
               for c in changepoints.family(changes, conf.tests(), t)]
    order = {p.name: i for i, p in enumerate(suite.profiles)}
    changes.sort(key=lambda c: (order[c.profile], -abs(math.log(size(c)))))
    return TrackResult(ref, found_lines, measured, counted, conf.ran, found, changes, judged,
                       cells.failed(store, measured + conf.ran))


def size(change: Change) -> float:
    """A change's after / before ratio (Change.step).  A run's changes are
    listed under their profile, largest step first, whichever series (the
    declared metrics', a syscall's) it is in."""
    return change.step


def _measure(store: Store, todo: list[cells.Work], here: driver.Here, resolver: Resolver,
             on_event: OnEvent, fleet: Fleet | None, done: int, total: int) -> list[int]:
    """Measure one series' missing cells, numbered within the whole run."""
    if not todo:
        return []

    def on_cell(block: list[cells.Cell], i: int, n: int) -> str:
        first, last = done + i + 1, done + i + len(block)
        numbers = f"cell {first}" if first == last else f"cells {first}-{last}"
        what = (f"{numbers}/{total}: {block[0].profile} on "
                f"{', '.join(f'{c.release.name} ({c.release.version})' for c in block)}")
        on_event(Progressed(what, done + i, total))
        return what
    return fleet.cells(todo, on_cell) if fleet else cells.measure(store, todo, here,
                                                                   resolver.prepare, on_cell,
                                                                   on_event)


def _confirm(suite: Suite, series: list[cells.Series], conf: Confirmations, t: Thresholds,
             fleet: Fleet | None) -> None:
    """The series' confirmations, in waves: every pair the series would
    measure next (each candidate's own pair first, a neighbour where that
    one said "same"), the count ones first, at once over the `fleet` (so
    that a batch's confirmations take about as long as each other) or one
    after another here.  Every confirmation a line needs is stored before
    its changes are found, so a change one series' confirmation shows in
    another series (a syscall's count measured for the window's candidate)
    is in this run's list as in a later report."""
    while asks := conf.wanted(lambda: [_changes(suite, s, conf, t) for s in series]):
        ordered = sorted(asks, key=lambda a: a.cls)
        if fleet is not None:
            conf.on_fleet(fleet, ordered)
            continue
        for a in ordered:
            conf.get(a.tracked, a.key[2], a.cls, a.before, a.after)


def _changes(suite: Suite, s: cells.Series, conf: Confirmations, t: Thresholds) -> list[Change]:
    """The series' candidates, confirmed; and the changes its stored
    confirmations decided on pairs that are still neighbours, which keep
    their verdict even where the segmentation no longer proposes them."""
    if len(s.points) < 2:
        return []
    tracked = next(p for p in suite.profiles if p.name == s.profile)
    points = {p.release.label: p for p in s.points}
    evidence: dict[tuple[str, str], Stored] = {}

    def emulated(before: str, after: str) -> bool:
        return points[before].emulated or points[after].emulated

    def confirm(before: str, after: str, measure: bool = True) -> tuple[Comparison | None, str]:
        got, c, outcome = conf.decide(tracked, s.kind, s.metric, points[before].release,
                                      points[after].release, emulated(before, after), t, measure)
        if got is not None:
            evidence[(before, after)] = got
        return c, outcome

    labels = [p.release.label for p in s.points]
    ratios = [p.ratio for p in s.points]
    out = changepoints.find((suite.name, s.profile, s.metric, s.kind), labels, ratios,
                            [p.ci for p in s.points], confirm, t)
    have = {(c.before, c.after) for c in out}
    for i in range(1, len(labels)):
        pair = (labels[i - 1], labels[i])
        if pair in have:
            continue
        kept = Change(changepoints.change_id(suite.name, s.profile, s.metric, s.kind, *pair),
                      s.profile, s.metric, s.kind, *pair, ratios[i] / ratios[i - 1],
                      *confirm(*pair, measure=False))
        if kept.decided:
            out.append(kept)
    out = [replace(c, emulated=emulated(c.before, c.after),
                   releases=(points[c.before].release, points[c.after].release)) for c in out]
    return [replace(c, evidence=evidence[(c.before, c.after)].experiment,
                    releases=evidence[(c.before, c.after)].releases)
            if (c.before, c.after) in evidence else c for c in out]
