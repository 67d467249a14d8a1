"""Where a trial runs.  Every target has the same calls, so the runner never
asks where an arm runs:

- `check(plan)`: before the first trial (consent for host changes, a guest
  kernel fetched);
- `run_trials(store, exp_id, plan, trials, announce) -> (done, failed)`: the
  given planned trials, each claimed, run and committed in the store as it
  ends (a trial is never counted twice: see `run_one`);
- `attribute(arm, plan) -> {kind: data}`: the attribution runs of one arm,
  after the timing trials, never inside them.

Targets that run a trial in this process (`host`, `qemu`, `baremetal`, the
tests' fake) are `LocalTarget`s: they implement `run_trial(arm, plan) ->
TrialResult` and inherit `run_trials`; one that can run a plan's trials
several at a time says how many (`side_by_side`), and `run_side_by_side`
runs them so; one whose trials' counting passes may run beside each other
while their timed passes may not says how many (`counting_side_by_side`)
and splits its trials (`timed_pass`), and `run_counting_side_by_side`
runs them so.  A fleet machine (fleet/coordinator.py) runs its trials
through its worker instead.  `TargetPool` gives each arm its target, made
by a factory: the local one by default, a fleet machine's or the tests'
fake when one is passed in.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from mmlab.errors import Interrupted, MmlabError
from mmlab.workloads.samples import Sample

if TYPE_CHECKING:
    from mmlab.experiment.plan import Arm, Plan
    from mmlab.store import Store, Trial
    from mmlab.targets.baremetal import BareMetalTarget


@dataclass
class TrialResult:
    samples: list[Sample]
    environment: dict


class TrialError(MmlabError):
    """A failed trial, with the environment it failed in."""

    def __init__(self, message: str, environment: dict | None = None):
        super().__init__(message)
        self.environment = environment


Announce = Callable[["Trial"], None]     # told as each trial starts


class Target(Protocol):
    @property
    def name(self) -> str: ...

    def check(self, plan: Plan) -> None: ...

    def run_trials(self, store: Store, exp_id: int, plan: Plan, trials: list[Trial],
                   announce: Announce) -> tuple[int, int]: ...

    def attribute(self, arm: Arm, plan: Plan) -> dict[str, dict]: ...


class LocalTarget(ABC):
    """A target that runs each trial here, one after another."""

    name: str

    @abstractmethod
    def check(self, plan: Plan) -> None:
        """Refuse the plan before its first trial, naming why."""

    @abstractmethod
    def run_trial(self, arm: Arm, plan: Plan) -> TrialResult:
        """One trial with the arm's settings applied and restored."""

    @abstractmethod
    def attribute(self, arm: Arm, plan: Plan) -> dict[str, dict]:
        """The attribution runs of one arm, after its timing trials."""

    def side_by_side(self, plan: Plan) -> int:
        """How many of the plan's trials may run here at once: one, unless
        no trial's figures can be moved by another running beside it."""
        return 1

    def counting_side_by_side(self, plan: Plan) -> int:
        """How many trials' counting passes may run at once, after their
        timed passes ran one at a time (`timed_pass`): one, unless a trial's
        counted figures cannot be moved by another running beside it while
        its timed ones can."""
        return 1

    def timed_pass(self, arm: Arm, plan: Plan) -> Callable[[], TrialResult]:
        """The part of a trial that must run alone, run now, and what
        finishes the trial (its counting pass, which may run beside other
        trials' when `counting_side_by_side` says so).  A target that does
        not split its trials runs the whole of one here."""
        result = self.run_trial(arm, plan)
        return lambda: result

    def attribution_side_by_side(self, plan: Plan) -> int:
        """How many arms' attribution runs may run at once: one, unless no
        figure they take can be moved by another running beside it."""
        return 1

    def stop(self) -> None:  # noqa: B027 (one trial at a time: none runs on a worker thread)
        """End the trials running now, on worker threads (an interrupt)."""

    def release(self) -> None:  # noqa: B027 (most keep nothing up between trials)
        """Let go of what is kept up from one trial to the next (a bare-metal
        machine): after a batch, or when a fleet worker's queue runs dry."""

    def run_trials(self, store: Store, exp_id: int, plan: Plan, trials: list[Trial],
                   announce: Announce) -> tuple[int, int]:
        """The trials one after another, then the target released: nothing
        it keeps up outlives the batch."""
        done = failed = 0
        try:
            for trial in trials:
                announce(trial)
                outcome = run_one(store, trial, plan, self)
                done += outcome is True
                failed += outcome is False
        finally:
            self.release()
        return done, failed


def run_one(store: Store, trial: Trial, plan: Plan, target: LocalTarget) -> bool | None:
    """Take one planned trial, run it with `target` and commit it: True when
    done, False when failed, None when it was not planned or its claim was
    lost (a fleet message delivered twice, a worker thought lost): nothing is
    then counted.  Ctrl-C puts it back into the plan."""
    claim = store.start_trial(trial.id)
    if claim is None:
        return None
    try:
        result = target.run_trial(trial_arm(plan, trial), plan)
    except Interrupted:
        store.replan_trial(trial.id)
        raise
    except MmlabError as exc:
        return _failed(store, trial, exc, claim)
    return _done(store, trial, result, claim)


def trial_arm(plan: Plan, trial: Trial) -> Arm:
    """The trial's arm with its round, which a guest restored from one of
    several saved boots takes its boot from (snapshot.rotation)."""
    return plan.arm(trial.arm).model_copy(update={"round": trial.round})


def _failed(store: Store, trial: Trial, exc: MmlabError, claim: float) -> bool | None:
    ended = store.fail_trial(trial.id, str(exc), getattr(exc, "environment", None), claim)
    return False if ended else None


def _done(store: Store, trial: Trial, result: TrialResult, claim: float) -> bool | None:
    return True if store.finish_trial(trial.id, result.samples, result.environment,
                                      claim) else None


class _Beside:
    """Trials of one batch run on worker threads: each claimed and committed
    on the calling thread (the store's connection stays on it) as it ends.
    Ctrl-C ends the running ones (`stop`) and puts every claimed trial not
    yet committed back into the plan; the targets are released at the end,
    as after `run_trials`."""

    def __init__(self, store: Store, plan: Plan, trials: list[Trial], pool: TargetPool,
                 announce: Announce):
        self.store, self.plan, self.announce = store, plan, announce
        self.targets = {t.id: pool.local(plan.arm(t.arm)) for t in trials}
        self.running: dict[Future[TrialResult], tuple[Trial, float]] = {}
        self.claimed: dict[int, Trial] = {}       # claimed and not yet committed
        self.outcomes: list[bool | None] = []

    def claim(self, trial: Trial) -> float | None:
        self.announce(trial)
        claim = self.store.start_trial(trial.id)
        if claim is not None:
            self.claimed[trial.id] = trial
        return claim

    def submit(self, workers: ThreadPoolExecutor, trial: Trial, claim: float,
               job: Callable[[], TrialResult]) -> None:
        self.running[workers.submit(job)] = (trial, claim)

    def failed(self, trial: Trial, exc: MmlabError, claim: float) -> None:
        self.outcomes.append(_failed(self.store, trial, exc, claim))
        del self.claimed[trial.id]

    def settle(self, how: str) -> None:
        """Commit the trials that ended: the first to end (FIRST_COMPLETED)
        or all of them (ALL_COMPLETED).  A trial that failed is stored as
        failed; a commit that fails (a full disk) ends the run, never a trial."""
        for fut in wait(self.running, return_when=how).done:
            trial, claim = self.running.pop(fut)
            try:
                result = fut.result()
            except MmlabError as exc:
                self.outcomes.append(_failed(self.store, trial, exc, claim))
            else:
                self.outcomes.append(_done(self.store, trial, result, claim))
            del self.claimed[trial.id]

    @contextmanager
    def workers(self, width: int) -> Iterator[ThreadPoolExecutor]:
        mine = {id(t): t for t in self.targets.values()}.values()
        try:
            with ThreadPoolExecutor(width, thread_name_prefix="trial") as workers:
                try:
                    yield workers
                except Interrupted:
                    for trial in self.claimed.values():
                        self.store.replan_trial(trial.id)
                    for target in mine:
                        target.stop()
                    raise
        finally:
            for target in mine:
                target.release()

    def counted(self) -> tuple[int, int]:
        return self.outcomes.count(True), self.outcomes.count(False)


def run_side_by_side(store: Store, plan: Plan, trials: list[Trial], pool: TargetPool,
                     width: int, announce: Announce) -> tuple[int, int]:
    """`trials` in planned order, up to `width` running at once, each whole
    trial on its own worker thread (a plan no trial's figures can be moved
    by another beside it: `side_by_side`)."""
    beside = _Beside(store, plan, trials, pool, announce)
    with beside.workers(width) as workers:
        for trial in trials:
            if len(beside.running) >= width:
                beside.settle(FIRST_COMPLETED)
            if (claim := beside.claim(trial)) is not None:
                job = functools.partial(beside.targets[trial.id].run_trial,
                                        trial_arm(plan, trial), plan)
                beside.submit(workers, trial, claim, job)
        beside.settle(ALL_COMPLETED)
    return beside.counted()


def run_counting_side_by_side(store: Store, plan: Plan, trials: list[Trial], pool: TargetPool,
                              width: int, announce: Announce) -> tuple[int, int]:
    """`trials` in planned order, `width` at a time: their timed passes one
    after another on this thread, nothing beside them, then their counting
    passes together on worker threads (`counting_side_by_side`); the next
    timed pass starts once those have ended, so no timed window ever has a
    neighbour of mmlab's own."""
    beside = _Beside(store, plan, trials, pool, announce)
    with beside.workers(width) as workers:
        for start in range(0, len(trials), width):
            timed: list[tuple[Trial, float, Callable[[], TrialResult]]] = []
            for trial in trials[start:start + width]:
                if (claim := beside.claim(trial)) is None:
                    continue
                try:
                    timed.append((trial, claim, beside.targets[trial.id].timed_pass(
                        trial_arm(plan, trial), plan)))
                except MmlabError as exc:
                    beside.failed(trial, exc, claim)
            for trial, claim, counting_pass in timed:
                beside.submit(workers, trial, claim, counting_pass)
            beside.settle(ALL_COMPLETED)
    return beside.counted()


MakeTarget = Callable[["Arm"], Target]


class TargetPool:
    """The targets of one run, one per place an arm names (`Arm.target`),
    made on first use by `make` and kept, so a guest kernel is fetched once.
    `say`, given once, is where targets' lines go (a command's display)."""

    def __init__(self, allow_host_changes: bool = False, say: Callable[[str], None] = print,
                 make: MakeTarget | None = None, bare_metal: BareMetalTarget | None = None):
        self.allow_host_changes = allow_host_changes
        self.say = say
        self.make = make or self.local_target
        self.bare_metal = bare_metal        # None: made for the machine $MMLAB_BARE_METAL names
        self.made: dict[str, Target] = {}

    def target(self, arm: Arm) -> Target:
        if arm.target not in self.made:
            self.made[arm.target] = self.make(arm)
        return self.made[arm.target]

    def local(self, arm: Arm) -> LocalTarget:
        """The arm's target, which must run its trials in this process."""
        target = self.target(arm)
        if not isinstance(target, LocalTarget):
            raise MmlabError(f"{target.name} does not run trials here")
        return target

    def side_by_side(self, plan: Plan, trials: list[Trial]) -> int:
        """How many of `trials` may run at once: the fewest any of their
        targets allows, one if any is not here (a fleet machine queues its
        own)."""
        return self._fewest([plan.arm(t.arm) for t in trials], lambda t: t.side_by_side(plan))

    def counting_side_by_side(self, plan: Plan, trials: list[Trial]) -> int:
        """How many of `trials`' counting passes may run at once after their
        timed passes ran one at a time, as `side_by_side` counts."""
        return self._fewest([plan.arm(t.arm) for t in trials],
                            lambda t: t.counting_side_by_side(plan))

    def attribution_side_by_side(self, plan: Plan) -> int:
        """How many of the plan's arms' attribution runs may run at once."""
        return self._fewest(plan.arms, lambda t: t.attribution_side_by_side(plan))

    def stop(self, plan: Plan) -> None:
        """End whatever the plan's arms' targets run on worker threads."""
        for target in self._targets(plan.arms):
            if isinstance(target, LocalTarget):
                target.stop()

    def _targets(self, arms: list[Arm]) -> list[Target]:
        return list({id(t): t for t in map(self.target, arms)}.values())

    def _fewest(self, arms: list[Arm], allows: Callable[[LocalTarget], int]) -> int:
        return min((allows(t) if isinstance(t, LocalTarget) else 1
                    for t in self._targets(arms)), default=1)

    def check(self, plan: Plan) -> None:
        """Every target the plan uses checks it before the first trial."""
        for target in {self.target(a).name: self.target(a) for a in plan.arms}.values():
            target.check(plan)

    def local_target(self, arm: Arm) -> Target:
        """The running kernel for host arms, a QEMU guest for guest arms;
        for bare-metal ones the pool's bare-metal target (a fleet worker's,
        one for all its pools, as its machine is one) or one for the machine
        $MMLAB_BARE_METAL names."""
        from mmlab.targets.host import HostTarget
        from mmlab.targets.qemu import QemuTarget
        if arm.bare_metal:
            from mmlab.targets import baremetal
            return self.bare_metal or baremetal.BareMetalTarget(baremetal.machine(self.say),
                                                                self.say)
        if arm.kernel == "host":
            return HostTarget(self.allow_host_changes)
        return QemuTarget(arm.kernel, self.say, self.allow_host_changes)
