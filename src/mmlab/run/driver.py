"""The one way an experiment is run: check, create or resume, run through
the place its trials run, attribute, and hand back what a command renders.

`mmlab run`, `experiment run|resume` (here or on a fleet), `ab`, `narrow`
and `track run` all come through `run_experiment`; they parse before it
and render after it, and hear progress through one `OnEvent` (events.py).
Where the trials run is a `Place`: `Here` (a TargetPool on this machine:
the host, QEMU guests, the tests' fake) or a fleet's machines
(fleet/place.py), so a command never wires the runner, the targets or the
coordinator itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from mmlab.experiment.plan import Plan, with_limits
from mmlab.run import runner
from mmlab.run.events import Created, OnEvent, ignore
from mmlab.store import Store, Trial
from mmlab.targets import TargetPool


@dataclass(frozen=True)
class Options:
    """How to run, as the command line asked: attribution after the
    trials, matched-state controls, and limits on the rounds and time."""
    attribute: bool = False
    with_controls: bool = True
    max_repetitions: int | None = None
    budget_s: float | None = None


class Place(Protocol):
    """Where an experiment's trials run."""

    def check(self, plan: Plan, attribute: bool) -> None:
        """Refuse before anything is stored (consent, a kernel to fetch,
        attribution a place cannot do)."""

    def create(self, store: Store, plan: Plan) -> list[int]:
        """Store `plan` as the experiments this place runs it as."""

    def members(self, store: Store, exp_id: int) -> list[int]:
        """The stored experiments that run together with `exp_id`."""

    def run(self, store: Store, ids: list[int], with_controls: bool,
            on_event: OnEvent) -> dict[int, runner.RunResult]:
        """Every planned trial of `ids`, with looks and controls."""

    def attribute(self, store: Store, exp_id: int, plan: Plan, on_event: OnEvent) -> int:
        """Attribution runs of every arm; how many arms got it."""


@dataclass
class Here:
    """This machine's targets, through one pool for the whole command, so a
    kernel is fetched and a guest's boot saved once however many
    experiments a command runs (narrow's steps, the tracker's cells)."""
    pool: TargetPool

    def check(self, plan: Plan, attribute: bool) -> None:
        self.pool.check(plan)

    def create(self, store: Store, plan: Plan) -> list[int]:
        return [store.create_experiment(plan)]

    def members(self, store: Store, exp_id: int) -> list[int]:
        return [exp_id]

    def run(self, store: Store, ids: list[int], with_controls: bool,
            on_event: OnEvent) -> dict[int, runner.RunResult]:
        return {e: runner.run(store, e, store.plan(e), self.pool, on_event, with_controls)
                for e in ids}

    def attribute(self, store: Store, exp_id: int, plan: Plan, on_event: OnEvent) -> int:
        return runner.attribute(store, exp_id, plan, self.pool, on_event)


@dataclass
class Outcome:
    """What a command renders: each experiment's run (the final plan, the
    measurements, the last look's judgement), its attribution and its
    failed trials, and the store that holds them."""
    store: Store
    ids: list[int]
    results: dict[int, runner.RunResult]
    attributed: dict[int, int] = field(default_factory=dict)
    failed: dict[int, list[Trial]] = field(default_factory=dict)

    @property
    def exp_id(self) -> int:
        """The first (on one machine, the only) experiment."""
        return self.ids[0]

    @property
    def result(self) -> runner.RunResult:
        return self.results[self.exp_id]

    @property
    def failures(self) -> int:
        return sum(len(f) for f in self.failed.values())


def run_experiment(store: Store | str, start: Plan | int | list[int], place: Place,
                   options: Options = Options(), on_event: OnEvent = ignore) -> Outcome:
    """Run `start` at `place`: a new plan (stored first, `Created` said), a
    stored experiment to finish or extend (with its fleet siblings), or
    several stored ones at once (a fleet batch).  `store` may be where the
    store is (a results directory, a postgresql:// URL): it is then opened
    only once the place accepted the plan, so a refused plan creates
    nothing."""
    if isinstance(start, Plan):
        plan = with_limits(start, options.max_repetitions, options.budget_s)
        place.check(plan, options.attribute or plan.profile.attribute)
        store = Store(store) if isinstance(store, str) else store
        ids = place.create(store, plan)
        on_event(Created(store, ids, plan))
    else:
        store = Store(store, create=False) if isinstance(store, str) else store
        ids = place.members(store, start) if isinstance(start, int) else list(start)
        plan = _resumed(store, ids, options)
        place.check(plan, options.attribute or plan.profile.attribute)
    results = place.run(store, ids, options.with_controls, on_event)
    attributed = {e: place.attribute(store, e, results[e].plan, on_event) for e in ids
                  if options.attribute or results[e].plan.profile.attribute}
    failed = {e: store.trials(e, status="failed") for e in ids}
    return Outcome(store, ids, results, attributed, failed)


def _resumed(store: Store, ids: list[int], options: Options) -> Plan:
    """The stored plans with the command line's limits, checked before any
    is stored; returns the first."""
    with_limits(store.plan(ids[0]), options.max_repetitions, options.budget_s)
    return [store.set_limits(e, options.max_repetitions, options.budget_s) for e in ids][0]
