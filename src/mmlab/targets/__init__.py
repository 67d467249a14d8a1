"""Where a trial runs.  Every target has the same calls, so the runner never
asks where an arm runs:

- `check(plan)`: before the first trial (consent for host changes, a guest
  kernel fetched);
- `run_trials(store, exp_id, plan, trials, announce) -> (done, failed)`: the
  given planned trials, each claimed, run and committed in the store as it
  ends (a trial is never counted twice: see `run_one`);
- `attribute(arm, plan) -> {kind: data}`: the attribution runs of one arm,
  after the timing trials, never inside them.

Targets that run a trial in this process (`host`, `qemu`, the tests' fake)
are `LocalTarget`s: they implement `run_trial(arm, plan) -> TrialResult`
and inherit `run_trials`.  A fleet machine (fleet/coordinator.py) runs its
trials through its worker instead.  `TargetPool` gives each arm its target,
made by a factory: the local one by default, a fleet machine's or the
tests' fake when one is passed in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from mmlab.errors import Interrupted, MmlabError
from mmlab.workloads.samples import Sample

if TYPE_CHECKING:
    from mmlab.experiment.plan import Arm, Plan
    from mmlab.store import Store, Trial


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

    def run_trials(self, store: Store, exp_id: int, plan: Plan, trials: list[Trial],
                   announce: Announce) -> tuple[int, int]:
        done = failed = 0
        for trial in trials:
            announce(trial)
            outcome = run_one(store, trial, plan, self)
            done += outcome is True
            failed += outcome is False
        return done, failed


def run_one(store: Store, trial: Trial, plan: Plan, target: LocalTarget) -> bool | None:
    """Take one planned trial, run it with `target` and commit it: True when
    done, False when failed, None when it was not planned or its claim was
    lost (a fleet message delivered twice, a worker thought lost): nothing is
    then counted.  Ctrl-C puts it back into the plan."""
    arm = plan.arm(trial.arm)
    claim = store.start_trial(trial.id)
    if claim is None:
        return None
    try:
        result = target.run_trial(arm, plan)
    except Interrupted:
        store.replan_trial(trial.id)
        raise
    except MmlabError as exc:
        ended = store.fail_trial(trial.id, str(exc), getattr(exc, "environment", None), claim)
        return False if ended else None
    return True if store.finish_trial(trial.id, result.samples, result.environment,
                                      claim) else None


MakeTarget = Callable[["Arm"], Target]


class TargetPool:
    """The targets of one run, one per place an arm names (`Arm.target`),
    made on first use by `make` and kept, so a guest kernel is fetched once.
    `say`, given once, is where targets' lines go (a command's display)."""

    def __init__(self, allow_host_changes: bool = False, say: Callable[[str], None] = print,
                 make: MakeTarget | None = None):
        self.allow_host_changes = allow_host_changes
        self.say = say
        self.make = make or self.local_target
        self.made: dict[str, Target] = {}

    def target(self, arm: Arm) -> Target:
        if arm.target not in self.made:
            self.made[arm.target] = self.make(arm)
        return self.made[arm.target]

    def check(self, plan: Plan) -> None:
        """Every target the plan uses checks it before the first trial."""
        for target in {self.target(a).name: self.target(a) for a in plan.arms}.values():
            target.check(plan)

    def local_target(self, arm: Arm) -> Target:
        """The running kernel for host arms, a QEMU guest for the others."""
        from mmlab.targets.host import HostTarget
        from mmlab.targets.qemu import QemuTarget
        if arm.kernel == "host":
            return HostTarget(self.allow_host_changes)
        return QemuTarget(arm.kernel, self.say)
