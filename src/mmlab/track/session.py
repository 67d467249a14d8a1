"""One `mmlab track run`: the catalog read again, every missing cell
measured, change points found over every series and each candidate
confirmed by measuring its two releases against each other.

Confirmations are experiments in the store like cells, keyed by the pair's
exact versions, so a confirmed change keeps its verdict (and its stable ID)
as new releases arrive, and a run with nothing new measures nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from mmlab.judge import verdicts
from mmlab.judge.comparison import Comparison
from mmlab.kernels import catalog
from mmlab.run import runner
from mmlab.store import Store
from mmlab.targets import TargetPool
from mmlab.track import cells, changepoints
from mmlab.track.changepoints import Change, Thresholds
from mmlab.track.suite import Suite

CONFIRM_ROUNDS, CONFIRM_MAX_ROUNDS = 12, 25   # a confirmation: adaptive looks until decided


@dataclass
class Result:
    measured: list[int]             # cells measured now
    confirmations: list[int]        # confirmation experiments run now
    series: list[cells.Series]
    changes: list[Change]


def run(store: Store, suite: Suite, pool: TargetPool, refresh: bool = True,
        say: Callable[[str], None] = print,
        version: Callable[[str], str] = cells.version_of,
        t: Thresholds = Thresholds(), measure: bool = True) -> Result:
    """Measure what is missing, then find and confirm the changes; with
    `measure` False only what is stored is read (a report): candidates
    without a stored confirmation stay unconfirmed."""
    if refresh:
        catalog.Apt().refresh()
    measured = cells.measure(store, suite, pool,
                             lambda c, i, n: say(f"cell {i + 1}/{n}: {c.profile} on {c.kernel} "
                                                 f"({c.version}) against {suite.reference}"),
                             version) if measure else []
    found = cells.series(store, suite, version)
    ran: list[int] = []
    changes = [ch for s in found
               for ch in _changes(store, suite, s, pool, ran, version, t, measure)]
    return Result(measured, ran, found, changepoints.family(changes, t))


def _changes(store: Store, suite: Suite, s: cells.Series, pool: TargetPool, ran: list[int],
             version: Callable[[str], str], t: Thresholds, measure: bool) -> list[Change]:
    points = [p for p in s.points if p.comparison is not None or p.kernel == suite.reference]
    if len(points) < 2:
        return []
    tracked = next(p for p in suite.profiles if p.name == s.profile)

    def confirm(before: str, after: str) -> Comparison | None:
        exp_id = _confirmation(store, suite, tracked, before, after, pool, ran, version,
                               measure)
        if exp_id is None:
            return None
        judged = verdicts.judge(store.plan(exp_id), store.measurements(exp_id))
        return next(c for c in judged.comparisons if c.metric == s.metric)
    return changepoints.find(
        suite.name, s.profile, s.metric, [p.kernel for p in points], [p.ratio for p in points],
        [(p.comparison.ci_low, p.comparison.ci_high) if p.comparison else (1.0, 1.0)
         for p in points], confirm, t)


def _confirmation(store: Store, suite: Suite, tracked, before: str, after: str,
                  pool: TargetPool, ran: list[int], version: Callable[[str], str],
                  measure: bool) -> int | None:
    """The stored confirmation of this pair at these versions, or a new one
    (none when only reading)."""
    versions = f"{version(before)}..{version(after)}"
    key = f"track-confirm {suite.name} {tracked.name} {before} {after} {versions}"
    for row in store.experiments():
        if json.loads(row["plan"])["profile"].get("derived", "").startswith(key):
            return row["id"]
    if not measure:
        return None
    plan = cells.cell_plan(suite, tracked, [before, after], key, CONFIRM_ROUNDS,
                           CONFIRM_MAX_ROUNDS)
    exp_id = store.create_experiment(plan)
    runner.run(store, exp_id, plan, pool)
    ran.append(exp_id)
    return exp_id
