"""Cells: one profile on one release, measured against the suite's
reference, interleaved and paired by round and audited, so every stored
figure is a ratio measured side by side and machine drift between cells
measured days apart cancels.

Cells of one profile are measured in blocks: one experiment of up to
BLOCK releases and the reference, every arm once per round, each release's
ratio paired with the reference trial of its round.  A block of five
releases runs six trials a round where five pairs would run ten.  A cell
that measures time has CELL_ROUNDS = 6 rounds, one that counts
instructions alone COUNT_CELL_ROUNDS = 4 (their noise is some hundred
times smaller); a block holds only as many releases as make whole
Williams squares (schedule.py) of its arms in its rounds: 5, 2 or 1 in 6
rounds, 3 or 1 in 4, so every block's schedule is balanced.  A block of
one is the two-kernel experiment narrow.pair_experiment runs.

A cell is keyed by the exact package versions of its release and of the
reference, and by the profile's settings (a block's key lists its
releases), so a new point release is a new cell, a changed profile is
measured again, and a second run with nothing
new measures nothing.  The key travels in the experiment's derived profile
(`derived`), so the store alone says which cells exist; an interrupted cell
is resumed, never measured twice.  The reference is pinned: a series name
(debian:6.12) keeps the point release the store's cells were measured
against, so a new 6.12 point release does not move every ratio.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from mmlab.errors import MmlabError
from mmlab.experiment.plan import Plan
from mmlab.judge.comparison import Comparison
from mmlab.kernels import specs
from mmlab.run import driver, narrow
from mmlab.run.events import Message, OnEvent, ignore
from mmlab.store import Store, Trial
from mmlab.track import changepoints
from mmlab.track.judged import Judgements
from mmlab.track.releases import ACROSS, Line, Release, Resolver
from mmlab.track.suite import Suite, Tracked
from mmlab.workloads import insns

CELL_ROUNDS = 6      # one look: a cell measures a ratio; confirmations decide (simulate.py)
COUNT_CELL_ROUNDS = 4   # a cell of instruction counts alone (CV ~0.05 %: docs/instructions.md)
BLOCK = 5            # releases per experiment at most
KEY = re.compile(r"^track (?P<suite>\S+) (?P<profile>\S+) (?P<digest>\S+) (?P<releases>.+?) "
                 r"vs (?P<ref>\S+) (?P<refversion>[^\s;]+)")
OWNER = re.compile(r"^track(?P<confirm>-confirm)? (?P<suite>\S+) (?P<profile>\S+) ")


@dataclass(frozen=True)
class Cell:
    suite: str
    profile: str
    digest: str           # the profile's settings (profile_digest)
    release: Release
    reference: Release

    @property
    def ident(self) -> tuple[str, str, str, str, str]:
        """What makes two cells the same measurement (labels aside)."""
        return (self.profile, self.release.name, self.release.version, self.reference.name,
                self.reference.version)


@dataclass(frozen=True)
class Key:
    """A stored cell experiment's key, read back."""
    experiment: int
    suite: str
    profile: str
    digest: str
    releases: list[tuple[str, str]]     # (name, package version) of each release measured
    reference: tuple[str, str]


def keys(store: Store) -> list[Key]:
    """The key of every cell experiment in the store, oldest first."""
    out = []
    for exp_id, text in derived(store):
        m = KEY.match(text)
        if m:
            measured = [tuple(r.split(" ", 1)) for r in m["releases"].split(" + ")]
            out.append(Key(exp_id, m["suite"], m["profile"], m["digest"], measured,
                           (m["ref"], m["refversion"])))
    return out


def profile_digest(tracked: Tracked) -> str:
    """The tracked profile's settings, without what the tracker replaces
    (kernels, baseline, metrics, rounds) or what does not measure (names,
    comments): a changed profile is a new set of cells."""
    p = tracked.plan.profile
    body = p.model_dump(mode="json", exclude={"name", "description", "kernel", "baseline",
                                              "metrics", "repetitions", "max_repetitions",
                                              "derived", "attribution"})
    body["matrix"] = {k: v for k, v in body.get("matrix", {}).items() if k != "kernel"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]


def derived(store: Store) -> list[tuple[int, str]]:
    """(experiment, derived key) of every experiment in the store."""
    return [(row["id"], json.loads(row["plan"])["profile"].get("derived", ""))
            for row in store.experiments()]


def check_owner(store: Store, suite: Suite) -> None:
    """One store per suite: a store holding another suite's cells is refused."""
    for _, key in derived(store):
        m = OWNER.match(key)
        if m and m["suite"] != suite.name:
            raise MmlabError(f"--results {store.where}: holds cells of suite {m['suite']!r}, not "
                             f"{suite.name!r}; give each suite its own store")


def stored(store: Store, suite: Suite) -> dict[tuple[str, str, str, str, str], int]:
    """The suite's cells in the store, by `Cell.ident` (with the digest the
    profile has now), the newest experiment of each."""
    digests = {t.name: profile_digest(t) for t in suite.profiles}
    found = {}
    for k in keys(store):
        if k.suite == suite.name and digests.get(k.profile) == k.digest:
            for name, version in k.releases:
                found[(k.profile, name, version, *k.reference)] = k.experiment
    return found


def remembered(store: Store, suite: Suite, ref: Release) -> list[Release]:
    """The releases the suite's cells against `ref` measured (the catalog
    may have dropped some since: releases.lines keeps them)."""
    return [Release(name, version, name) for k in keys(store)
            if k.suite == suite.name and k.reference == (ref.name, ref.version)
            for name, version in k.releases]


def reference(store: Store, suite: Suite, resolver: Resolver) -> Release:
    """The reference release: a point release as the suite names it, or for
    a series the point release the stored cells were measured against (the
    newest now when none is stored)."""
    label = suite.kernels[suite.reference_slot].removeprefix("debian:")
    pinned = [k.reference for k in keys(store) if k.suite == suite.name]
    if pinned and _pins(suite.reference) and \
            _series(pinned[-1][0]) == _series(suite.reference):
        return Release(pinned[-1][0], pinned[-1][1], label)
    return resolver.exact(suite.reference, label)


def _series(name: str) -> str | None:
    """debian:6.12 and debian:6.12.117 -> 6.12 (with the flavour); None otherwise."""
    if not name.startswith("debian:"):
        return None
    series, _, flavour = specs.parse_spec(name.removeprefix("debian:"))
    return f"{series}-{flavour}"


def _pins(name: str) -> bool:
    """A Debian series (debian:6.12) is pinned to a point release; a point
    release (debian:6.12.117), or a kernel not Debian's, is used as named."""
    return name.startswith("debian:") and \
        specs.parse_spec(name.removeprefix("debian:"))[1] is None


def cell_rounds(tracked: Tracked) -> int:
    """A cell's rounds: fewer where the profile's cells count instructions alone."""
    counts = insns.only(tracked.plan.workload, tracked.metrics)
    return COUNT_CELL_ROUNDS if counts else CELL_ROUNDS


def cell_plan(tracked: Tracked, rounds: int | None = None, max_rounds: int | None = None,
              correction: str = "holm", metrics: list[str] | None = None) -> Plan:
    """The profile judging the suite's metrics only (or `metrics`, one
    class of them), with the rounds the tracker's simulation assumes: a
    cell is a measurement of the ratio (one look, `cell_rounds`), a
    confirmation a decision (looks until decided, uncorrected inside the
    experiment: its family is the whole run's, changepoints.family)."""
    rounds = rounds or cell_rounds(tracked)
    max_rounds = max_rounds or rounds
    plan = tracked.plan
    return plan.model_copy(update={"profile": plan.profile.model_copy(
        update={"metrics": metrics or tracked.metrics, "repetitions": rounds,
                "max_repetitions": max_rounds, "correction": correction})})


def planned(suite: Suite, lines: list[Line], ref: Release) -> list[tuple[Tracked, Cell]]:
    """Every cell the suite asks for, once each: the series across releases
    first, then the branches, each in release order; never the reference."""
    out: dict[tuple, tuple[Tracked, Cell]] = {}
    for line in lines:
        for tracked in line_profiles(suite, line):
            digest = profile_digest(tracked)
            for r in line.releases:
                cell = Cell(suite.name, tracked.name, digest, r, ref)
                if (r.name, r.version) != (ref.name, ref.version):
                    out.setdefault(cell.ident, (tracked, cell))
    return list(out.values())


def line_profiles(suite: Suite, line: Line) -> list[Tracked]:
    """What a line's cells measure: every tracked profile with the suite's
    metrics; on a branch whose suite says `branch_metrics = "counts"`, only
    the profiles that count instructions, with their counts alone (a cell
    then runs one counting boot a trial and no timing boot)."""
    if line.kind == ACROSS or suite.branch_metrics == "all":
        return suite.profiles
    counted = [t.model_copy(update={"metrics": [m for m in t.metrics
                                                if insns.counted(t.plan.workload, m)]})
               for t in suite.profiles]
    return [t for t in counted if t.metrics]


@dataclass(frozen=True)
class Failed:
    """The failed trials of one release in a run's cells (or confirmations)
    of one profile."""
    what: str          # cell or confirmation
    profile: str
    kernel: str        # the release, as its arms boot it
    trials: int
    error: str         # the first one's first line


def failed(store: Store, ids: list[int]) -> list[Failed]:
    """Each release whose trials failed in the tracker experiments `ids`
    (cells, or confirmations), with how many and the first error: a run
    that measured them failed."""
    found: dict[tuple[str, str, str], list[Trial]] = {}
    for exp_id in ids:
        trials = store.trials(exp_id, "failed")
        if not trials:
            continue
        plan = store.plan(exp_id)
        m = OWNER.match(plan.profile.derived)
        what = ("confirmation" if m and m["confirm"] else "cell",
                m["profile"] if m else plan.profile.name)
        for t in trials:
            found.setdefault((*what, plan.arm(t.arm).kernel), []).append(t)
    return [Failed(*key, len(mine), (mine[0].error or "").strip().split("\n")[0])
            for key, mine in found.items()]


def unfinished(store: Store, exp_id: int) -> bool:
    """Trials still planned, or left running by a killed run."""
    return any(t.status in ("planned", "running") for t in store.trials(exp_id))


Work = tuple[Tracked, Cell, "int | None"]   # a cell to measure, and its unfinished experiment
# (cells, index of the first, total) -> what is said
OnCell = Callable[[list[Cell], int, int], str]


def pending(store: Store, suite: Suite, todo: list[tuple[Tracked, Cell]]) -> list[Work]:
    """The cells of `todo` not yet stored, and the stored ones an
    interrupted run left unfinished (with their experiment)."""
    have = stored(store, suite)
    return [(t, c, have.get(c.ident)) for t, c in todo
            if c.ident not in have or unfinished(store, have[c.ident])]


def measure(store: Store, work: list[Work], here: driver.Here,
            prepare: Callable[[Release], None], on_cell: OnCell,
            on_event: OnEvent = ignore) -> list[int]:
    """Measure the cells of `work` here, block after block; returns their
    experiments.  `on_event` hears the runs."""
    ran = []
    done = 0
    for block in blocks(work):
        what = on_cell(block.cells, done, len(work))
        done += len(block.cells)
        prepare(block.cells[0].reference)
        for cell in block.cells:
            prepare(cell.release)
        exp_id = block.experiment
        if exp_id is None:
            exp_id, _ = narrow.kernels_experiment(store, cell_plan(block.tracked), block.kernels,
                                                  block.key, here, what, on_event)
        else:
            on_event(Message(f"{what}: resumed (experiment {exp_id})"))
            driver.run_experiment(store, exp_id, here, on_event=on_event)
        ran.append(exp_id)
    return ran


@dataclass
class Block:
    """Cells of one profile measured in one experiment: `experiment` is
    an unfinished one to resume, None for a block not yet planned."""
    tracked: Tracked
    cells: list[Cell]
    experiment: int | None

    @property
    def kernels(self) -> list[str]:
        """The reference (the baseline), then the releases."""
        return [self.cells[0].reference.name, *(c.release.name for c in self.cells)]

    @property
    def key(self) -> str:
        """The stored key: every release measured, against the reference."""
        c = self.cells[0]
        measured = " + ".join(f"{x.release.name} {x.release.version}" for x in self.cells)
        return (f"track {c.suite} {c.profile} {c.digest} {measured} "
                f"vs {c.reference.name} {c.reference.version}")


def blocks(work: list[Work]) -> list[Block]:
    """`work` as experiments: an unfinished one once, with every cell it
    holds; new cells of one profile in blocks of block_sizes, in order."""
    out: list[Block] = []
    resumed: dict[int, Block] = {}
    new: dict[str, tuple[Tracked, list[Cell]]] = {}
    for tracked, cell, exp_id in work:
        if exp_id is None:
            new.setdefault(tracked.name, (tracked, []))[1].append(cell)
        elif exp_id in resumed:
            resumed[exp_id].cells.append(cell)
        else:
            resumed[exp_id] = Block(tracked, [cell], exp_id)
            out.append(resumed[exp_id])
    for tracked, mine in new.values():
        start = 0
        for size in block_sizes(len(mine), cell_rounds(tracked)):
            out.append(Block(tracked, mine[start:start + size], None))
            start += size
    return out


def block_sizes(n: int, rounds: int = CELL_ROUNDS) -> list[int]:
    """n releases in blocks as large as BLOCK allows whose arms (its
    releases and the reference) make whole Williams squares in `rounds`
    (k arms: k rounds a square, 2k when k is odd): in 6 rounds 21 -> 5, 5,
    5, 5, 1 and 4 -> 2, 2; in 4 rounds 21 -> 3 x 7 and 5 -> 3, 1, 1."""
    sizes: list[int] = []
    for k in range(BLOCK, 0, -1):
        square = (k + 1) * (1 if (k + 1) % 2 == 0 else 2)
        if rounds % square == 0:
            sizes += [k] * ((n - sum(sizes)) // k)
    return sizes


def kernel_comparison(plan: Plan, comparisons: list[Comparison], metric: str,
                      kernel: str | None = None) -> Comparison | None:
    """The comparison on `metric` of `kernel`'s arm against the first
    kernel (in a two-kernel experiment, the second against the first), not
    of a matched-state control's."""
    controls = {a.name for a in plan.arms if a.control_of}
    mine = {a.name for a in plan.arms if a.kernel == kernel} if kernel else None
    return next((c for c in comparisons if c.metric == metric and c.arm not in controls
                 and c.baseline not in controls and (mine is None or c.arm in mine)), None)


@dataclass(frozen=True)
class Point:
    """One release of a series: the tracked metric's ratio to the reference."""
    release: Release
    comparison: Comparison | None     # None for the reference itself (ratio 1)
    experiment: int | None
    emulated: bool = False            # its ratio is of emulated time (a TCG guest's clock)

    @property
    def ratio(self) -> float:
        return 1.0 if self.comparison is None else changepoints.stated_ratio(self.comparison)

    @property
    def ci(self) -> tuple[float, float]:
        c = self.comparison
        return (1.0, 1.0) if c is None else (c.ci_low, c.ci_high)


@dataclass(frozen=True)
class Series:
    profile: str
    metric: str
    kind: str
    points: list[Point]              # measured releases only, in release order

    @property
    def emulated(self) -> bool:
        """Some of its figures are emulated time."""
        return any(p.emulated for p in self.points)


def series(store: Store, suite: Suite, lines: list[Line], ref: Release,
           judged: Judgements) -> list[Series]:
    """Every (profile, metric, series) over its releases in release order,
    read back from the stored cells, each judged as `compare` judges it;
    releases with no cell yet, or no ratio for the metric (its trials
    failed, or it made no such call, or two builds of the plugin counted
    its two sides: a cell resumed after the plugin changed), are left out.  A line's series are of
    what its cells measure (line_profiles: a counts-only branch has no time
    series), and of every other count its cells hold (`followed`)."""
    have = stored(store, suite)
    out = []
    measured = {line.kind: {t.name: t for t in line_profiles(suite, line)} for line in lines}
    for profile in suite.profiles:
        for line in lines:
            tracked = measured[line.kind].get(profile.name)
            if tracked is None:
                continue
            ids = [have.get(Cell(suite.name, tracked.name, "", r, ref).ident)
                   for r in line.releases]
            extra = sorted({m for i in ids if i is not None for m in judged[i].followed}
                           - set(tracked.metrics))
            for metric in [*tracked.metrics, *extra]:
                points = []
                for r in line.releases:
                    if (r.name, r.version) == (ref.name, ref.version):
                        points.append(Point(r, None, None))
                        continue
                    exp_id = have.get(Cell(suite.name, tracked.name, "", r, ref).ident)
                    if exp_id is None:
                        continue
                    c = kernel_comparison(*judged.comparisons(exp_id), metric, r.name)
                    if c is not None and math.isfinite(x := changepoints.stated_ratio(c)) \
                            and x > 0 and not changepoints.across_builds(c):
                        points.append(Point(r, c, exp_id, judged[exp_id].emulated(c)))
                out.append(Series(tracked.name, metric, line.kind, points))
    return out
