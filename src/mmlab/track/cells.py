"""Cells: one (profile, kernel) pair measured against the suite's reference
kernel, interleaved and paired in one experiment, so every stored figure is
a ratio measured side by side and machine drift between cells measured days
apart cancels.  A cell is keyed by the exact package version of its kernel,
so a new point release is a new cell and a second run with nothing new
measures nothing.  The key travels in the derived profile (`derived`), so
the store alone says which cells exist.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from mmlab import experiment
from mmlab.errors import MmlabError
from mmlab.judge import verdicts
from mmlab.judge.comparison import Comparison
from mmlab.kernels import images, specs
from mmlab.run import runner
from mmlab.store import Store
from mmlab.targets import TargetPool
from mmlab.track.suite import Suite, Tracked

CELL_ROUNDS = 6      # the paired estimator's least rounds (track/simulate.py assumes it)
KEY = re.compile(r"^track (?P<suite>[^ ]+) (?P<profile>[^ ]+) (?P<kernel>[^ ]+) "
                 r"(?P<version>[^ ;]+)")


@dataclass(frozen=True)
class Cell:
    suite: str
    profile: str
    kernel: str
    version: str          # the exact package version (or the image's identity)

    @property
    def key(self) -> str:
        return f"track {self.suite} {self.profile} {self.kernel} {self.version}"


def version_of(kernel: str) -> str:
    """The exact package version a Debian name resolves to now; a cached
    local or built kernel's version."""
    if kernel.startswith("debian:"):
        return specs.resolve(kernel.removeprefix("debian:")).package_version
    return images.get(kernel).version


def planned(suite: Suite,
            version: Callable[[str], str] = version_of) -> list[tuple[Tracked, Cell]]:
    """Every cell the suite asks for: each profile on each kernel but the
    reference, in release order."""
    versions = {k: version(k) for k in suite.kernels if k != suite.reference}
    return [(t, Cell(suite.name, t.name, k, versions[k])) for t in suite.profiles
            for k in suite.kernels if k != suite.reference]


def stored(store: Store, suite: Suite) -> dict[Cell, int]:
    """The cells already in the store, by their key; a store holding another
    suite's cells is refused (one store per suite)."""
    found: dict[Cell, int] = {}
    for row in store.experiments():
        derived = json.loads(row["plan"])["profile"].get("derived", "")
        m = KEY.match(derived)
        if not m:
            continue
        if m["suite"] != suite.name:
            raise MmlabError(f"--results {store.where}: holds cells of suite {m['suite']!r}, not "
                             f"{suite.name!r}; give each suite its own store")
        found[Cell(suite.name, m["profile"], m["kernel"], m["version"])] = row["id"]
    return found


def cell_plan(suite: Suite, tracked: Tracked, kernels: list[str], note: str,
              rounds: int = CELL_ROUNDS, max_rounds: int = CELL_ROUNDS) -> experiment.Plan:
    """The profile on exactly `kernels` (the first the baseline), judging the
    suite's metrics only, with the rounds the tracker's simulation assumes:
    a cell is a measurement of the ratio (one look), a confirmation a
    decision (looks until decided)."""
    plan = tracked.plan
    plan = plan.model_copy(update={"profile": plan.profile.model_copy(
        update={"metrics": tracked.metrics, "repetitions": rounds,
                "max_repetitions": max_rounds})})
    return experiment.with_kernels(plan, kernels, note)


def measure(store: Store, suite: Suite, pool: TargetPool,
            on_cell: Callable[[Cell, int, int], None] = lambda c, i, n: None,
            version: Callable[[str], str] = version_of) -> list[int]:
    """Measure every planned cell not yet stored; returns the new experiments."""
    have = stored(store, suite)
    todo = [(t, c) for t, c in planned(suite, version) if c not in have]
    new = []
    for i, (tracked, cell) in enumerate(todo):
        on_cell(cell, i, len(todo))
        plan = cell_plan(suite, tracked, [suite.reference, cell.kernel], cell.key)
        exp_id = store.create_experiment(plan)
        runner.run(store, exp_id, plan, pool)
        new.append(exp_id)
    return new


@dataclass(frozen=True)
class Point:
    """One release of a series: the tracked metric's ratio to the reference."""
    kernel: str
    version: str
    comparison: Comparison | None     # None for the reference itself (ratio 1)
    experiment: int | None

    @property
    def ratio(self) -> float:
        return 1.0 if self.comparison is None else self.comparison.ratio


@dataclass(frozen=True)
class Series:
    profile: str
    metric: str
    points: list[Point]


def series(store: Store, suite: Suite, version: Callable[[str], str] = version_of) -> list[Series]:
    """Every (profile, metric) series over the suite's kernels in release
    order, read back from the stored cells (judged as `compare` judges)."""
    have = stored(store, suite)
    out = []
    for tracked in suite.profiles:
        judged: dict[str, tuple[Cell, int, list[Comparison]]] = {}
        for cell, exp_id in have.items():
            if cell.profile == tracked.name:
                judgement = verdicts.judge(store.plan(exp_id), store.measurements(exp_id))
                judged[cell.kernel] = (cell, exp_id, judgement.comparisons)
        for metric in tracked.metrics:
            points = []
            for k in suite.kernels:
                if k == suite.reference:
                    points.append(Point(k, version(k), None, None))
                elif k in judged:
                    cell, exp_id, comps = judged[k]
                    c = next((c for c in comps if c.metric == metric), None)
                    points.append(Point(k, cell.version, c, exp_id))
            out.append(Series(tracked.name, metric, points))
    return out
