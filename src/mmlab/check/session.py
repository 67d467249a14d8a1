"""One check of a series: each profile measured on the base kernel and the
patched one (the whole series applied), interleaved, on counts; every path
whose count changed by the count rule measured again with fresh rounds (a
confirmation, as the tracker confirms a candidate), and where it changed
again the same way, the kernel's instructions by function counted on both
kernels; in a series of several patches, the patch that brought each
change found by bisection over the kernels of the patches (each built
once, incrementally, and each pair measured once for all of a profile's
paths).

A check measures counts alone: they are exact in a TCG guest and decided
by magnitude (the count rule: the two sets apart, the step beyond their
own noise and a floor per kind of count), so a first look of few rounds
finds the candidates and the confirmation's rounds decide; no p-value is
asked for and no family corrected.

Over a fleet (`fleet`, the tracker's spread.Fleet) every profile's first
look, then every confirmation, runs at once, one experiment per machine;
a bisection's steps, one at a time, go there too; the attribution runs
here, as the tracker's does.

The check's coverage (coverage.py) says which functions the series
changes and which of them its paths ran on the base kernel: the base
counted by function once per profile (reach.py), only where some changed
function can be counted or the compiled kernels differ.

Records only: report/robot.py renders them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from mmlab.check import changes as series_changes
from mmlab.check import coverage, reach, variants
from mmlab.check.changes import Changes
from mmlab.check.coverage import Coverage
from mmlab.check.request import Request
from mmlab.errors import MmlabError
from mmlab.experiment.plan import with_kernels
from mmlab.judge.comparison import Comparison
from mmlab.judge.criteria import COUNT_FLOORS
from mmlab.kernels import kbuild
from mmlab.kernels.images import Kernel
from mmlab.run import driver, narrow
from mmlab.run.events import Message, OnEvent, ignore
from mmlab.store import Store
from mmlab.targets import probe
from mmlab.track import cells, changepoints, evidence
from mmlab.track import session as tracking
from mmlab.track.changepoints import Change
from mmlab.track.evidence import Evidence
from mmlab.track.releases import Release
from mmlab.track.suite import Suite, Tracked

if TYPE_CHECKING:
    from mmlab.track.spread import Fleet

FIRST_ROUNDS = cells.COUNT_CELL_ROUNDS      # the first look: finds the candidates
CONFIRM_ROUNDS = tracking.ROUNDS["counts"]  # a confirmation: decides them


@dataclass(frozen=True)
class Found:
    """A path whose count changed, confirmed, and the patch that brought it
    (1-based; None where the bisection could not place it)."""
    evidence: Evidence
    patch: int | None
    narrowing: list[str] = field(default_factory=list)   # each bisection step, a line

    @property
    def change(self) -> Change:
        return self.evidence.change


@dataclass(frozen=True)
class Unconfirmed:
    """A path the first look found changed that its confirmation did not."""
    profile: str
    metric: str
    first: str                      # the first look's outcome
    then: str                       # the confirmation's


@dataclass
class CheckResult:
    request: Request
    base: Kernel
    patched: Kernel
    paths: int                      # (profile, counted path) pairs judged
    rounds: int                     # the first look's rounds
    found: list[Found]
    unconfirmed: list[Unconfirmed]
    experiments: list[int]          # every experiment the check ran, in order
    failed: list[cells.Failed]
    machine: dict[str, object]      # probe.machine(): where the guests ran
    accelerator: str                # how the guests ran: tcg or kvm
    floors: dict[str, float] = field(default_factory=lambda: dict(COUNT_FLOORS))
    coverage: Coverage | None = None

    @property
    def changed(self) -> bool:
        return bool(self.found)


class Check:
    """The pairs a check measures, each once: (profile, kernel) against the
    base, so a bisection reuses the confirmation and its earlier steps;
    here, or over `fleet`'s machines."""

    def __init__(self, store: Store, here: driver.Here, on_event: OnEvent, note: str,
                 fleet: Fleet | None = None):
        self.store, self.here, self.on_event, self.note = store, here, on_event, note
        self.fleet = fleet
        self.judged = cells.Judgements(store)
        self.pairs: dict[tuple[str, str, str], int] = {}
        self.ran: list[int] = []

    def measure(self, t: Tracked, base: str, kernel: str, rounds: int, why: str) -> int:
        """The experiment of `t` on `kernel` against `base` for `why`
        (first, confirm, narrow), measured when not measured yet."""
        return self.measure_all([t], base, kernel, rounds, why)[0]

    def measure_all(self, ts: list[Tracked], base: str, kernel: str, rounds: int,
                    why: str) -> list[int]:
        """measure for each of `ts`: those not measured yet at once over the
        fleet (a batch per machine count), or one after another here."""
        def key(t: Tracked) -> tuple[str, str, str]:
            return t.name, kernel, "first" if why == "first" else "again"
        todo = [t for t in ts if key(t) not in self.pairs]
        plans = [cells.cell_plan(t, rounds, rounds, "none", t.metrics) for t in todo]
        notes = [f"check {self.note} {why} {t.name}" for t in todo]
        said = [f"{t.name}: {kernel} against {base} ({why}, {rounds} rounds)" for t in todo]
        if self.fleet is not None:
            ids = self.fleet.experiments(
                [with_kernels(p, [base, kernel], n) for p, n in zip(plans, notes)],
                lambda i: self.on_event(Message(f"{said[i]} (on the fleet)")))
        else:
            ids = [narrow.pair_experiment(self.store, p, base, kernel, n, self.here, w,
                                          self.on_event)[0]
                   for p, n, w in zip(plans, notes, said)]
        for t, exp_id in zip(todo, ids):
            self.pairs[key(t)] = exp_id
            self.ran.append(exp_id)
        return [self.pairs[key(t)] for t in ts]

    def comparison(self, exp_id: int, metric: str) -> Comparison | None:
        c = cells.kernel_comparison(*self.judged.comparisons(exp_id), metric)
        return c if c is not None and c.method else None

    def paths(self, exp_id: int, t: Tracked) -> list[str]:
        """The counted paths an experiment judged: the profile's metrics and
        every stay its counting pass stored."""
        return [m for m in dict.fromkeys([*t.metrics, *self.judged[exp_id].followed])
                if changepoints.is_count(m) and self.comparison(exp_id, m) is not None]


def run(store: Store, request: Request, kernels: list[Kernel], here: driver.Here,
        results: str, on_event: OnEvent = ignore, fleet: Fleet | None = None) -> CheckResult:
    """`kernels`: the base, then each patch's kernel (or the base and the
    whole series' alone); every profile of `request` measured on the last
    against the first: every first look, then every confirmation, so that
    a `fleet` runs each set at once."""
    base, patched = kernels[0], kernels[-1]
    changed = series_changes.read(request.patches, source(base, request.base), base.symbols) \
        if base.symbols.is_file() else None
    check = Check(store, here, on_event, f"{base.name}..{patched.name}", fleet)
    found: list[Found] = []
    unconfirmed: list[Unconfirmed] = []
    paths, looked = _first_looks(check, request.profiles, base.name, patched.name)
    for t in request.profiles:
        if moved := looked[t.name]:
            confirmed, missed = _confirm(check, t, base.name, patched.name, moved)
            unconfirmed += missed
            found += [_found(check, request, t, kernels, c, outcome, results)
                      for c, outcome in confirmed]
    return CheckResult(request, base, patched, paths, FIRST_ROUNDS, found, unconfirmed,
                       check.ran, cells.failed(store, check.ran), probe.machine(),
                       _accelerator(check), coverage=_coverage(check, request, kernels, changed))


def _first_looks(check: Check, profiles: list[Tracked], base: str, patched: str
                 ) -> tuple[int, dict[str, dict[str, str]]]:
    """Every profile's first look, then the confirmation of each that
    found a path moved (each set at once over a fleet): how many paths the
    first looks judged, and by profile the paths that moved and how."""
    firsts = check.measure_all(profiles, base, patched, FIRST_ROUNDS, "first")
    judged = {t.name: check.paths(first, t) for t, first in zip(profiles, firsts)}
    looked = {t.name: {m: o for m in judged[t.name]
                       if (o := changepoints.outcome_of(m, check.comparison(first, m)))
                       in changepoints.CONFIRMED}
              for t, first in zip(profiles, firsts)}
    check.measure_all([t for t in profiles if looked[t.name]], base, patched,
                      CONFIRM_ROUNDS[0], "confirm")
    return sum(map(len, judged.values())), looked


def source(base: Kernel, given: str) -> Path | None:
    """The base's source: its kept build tree, else the tree given as the
    base; None where there is neither (a Debian source never built here)."""
    key = base.details.get("build_key")
    kept = kbuild.base_dir(str(key)) / "tree" if key else None
    if kept and kept.is_dir():
        return kept
    return Path(given) if Path(given).is_dir() else None


def _coverage(check: Check, request: Request, kernels: list[Kernel],
              changed: Changes | None) -> Coverage | None:
    """Which changed functions the profiles' paths ran on the base: each
    profile counted by function on the base (reach.base_counts) where some
    changed function can be counted or the compiled kernels differ.  None
    where the base has no symbol table here (nothing says where a
    function's instructions are counted)."""
    if changed is None:
        return None
    base, patched = kernels[0], kernels[-1]
    layout = coverage.compare(base.symbols, patched.symbols)
    counts: dict[str, coverage.Counts] = {}
    failed: list[str] = []
    started = time.monotonic()
    if coverage.needs_counts(changed, layout):
        for t in request.profiles:
            exps = [e for why in ("again", "first")
                    if (e := check.pairs.get((t.name, patched.name, why))) is not None]
            got = reach.base_counts(check.store, check.here, check.on_event, base, t, exps)
            if got is not None:
                counts[t.name] = got
            else:
                failed.append(t.name)
    return coverage.cover(changed, counts, layout, variants.load(),
                          {t.name for t in request.profiles}, time.monotonic() - started,
                          failed)


def _confirm(check: Check, t: Tracked, base: str, patched: str, moved: dict[str, str]
             ) -> tuple[list[tuple[Comparison, str]], list[Unconfirmed]]:
    """The paths the first look found `moved` measured again with fresh
    rounds: those that changed the same way (their confirmation's
    comparison and outcome), counted by function on both kernels; and
    those that did not."""
    again = check.measure(t, base, patched, CONFIRM_ROUNDS[0], "confirm")
    confirmed, missed = [], []
    for m, o in moved.items():
        c = check.comparison(again, m)
        then = changepoints.outcome_of(m, c)
        if then == o and c is not None:
            confirmed.append((c, then))
        else:
            missed.append(Unconfirmed(t.name, m, o, then))
    if confirmed:
        check.here.attribute(check.store, again,
                             tracking.only_functions(check.judged[again].plan), check.on_event)
    return confirmed, missed


def _found(check: Check, request: Request, t: Tracked, kernels: list[Kernel], c: Comparison,
           outcome: str, results: str) -> Found:
    """A confirmed change with its evidence (the tracker's: the table's
    rows, the functions), its commands, and the patch that brought it."""
    base, patched = kernels[0], kernels[-1]
    again = check.pairs[(t.name, patched.name, "again")]
    suite = Suite(name=f"check-{request.suite}", path="", text="", reference=base.name,
                  kernels=[k.name for k in kernels], reference_slot=0, branches=[],
                  profiles=[t])
    change = Change(changepoints.change_id("check", base.name, patched.name, t.name, c.metric),
                    t.name, c.metric, "patch", "base", "patched", c.ratio, c, outcome, again,
                    (Release(base.name, base.version, "base"),
                     Release(patched.name, patched.version, "patched")))
    shown = evidence.gather(check.store, suite, change, results, check.judged)
    patch, steps = _brought(check, t, c.metric, kernels, again)
    return Found(replace(shown, commands=commands(request, t, again, results)), patch, steps)


def _brought(check: Check, t: Tracked, metric: str, kernels: list[Kernel],
             confirmation: int) -> tuple[int | None, list[str]]:
    """The patch that brought `metric`'s change: the only one, or the first
    whose kernel has it by bisection over the series' kernels (each pair
    measured once for every path of the profile; the whole series' is the
    confirmation)."""
    if len(kernels) == 2:
        return 1, []
    names = [k.name for k in kernels]

    def compare(ref: str, kernel: str) -> Comparison:
        exp_id = confirmation if kernel == names[-1] else \
            check.measure(t, ref, kernel, CONFIRM_ROUNDS[0], "narrow")
        c = check.comparison(exp_id, metric)
        if c is None:
            raise MmlabError(f"{kernel}: no comparison of {metric}")
        return c
    try:
        result = narrow.bisect(names, compare)
    except MmlabError as exc:
        check.on_event(Message(f"{t.name} {metric}: not placed in the series: {exc}"))
        return None, [f"not placed: {exc}"]
    n = len(names) - 1
    said = {name: f"{name} (base + patch{'es 1-' if i > 1 else ' '}{i} of {n})"
            for i, name in enumerate(names) if i}
    lines = result.lines(names, metric)
    for name, label in said.items():
        lines = [line.replace(name, label) for line in lines]
    return result.first_changed, lines


def commands(request: Request, t: Tracked, confirmation: int, results: str) -> dict[str, str]:
    """How to reproduce a change: the check of this profile alone, the
    confirmation's report, and its evidence bundle (which holds the
    standalone C reproducer)."""
    at = f" --results {results}"
    return {"reproduce": f"mmlab check {request.given} --profile {t.plan.path}{at}",
            "report": f"mmlab report {confirmation}{at}",
            "bundle": f"mmlab bundle {confirmation} check-{confirmation}-evidence --tar{at}"}


def _accelerator(check: Check) -> str:
    """How the guests ran, as the first experiment's samples say."""
    for exp_id in check.ran:
        for samples in check.judged[exp_id].measured.by_arm.values():
            for s in samples:
                if "accelerator" in s.state:
                    return str(s.state["accelerator"])
    return "unknown"

