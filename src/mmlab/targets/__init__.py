"""Where a trial runs.  Every target has the same three calls, so the runner
never asks where an arm runs:

- `check(plan)`: before the first trial (consent for host changes, a guest
  kernel fetched);
- `run_trial(arm, plan) -> TrialResult`: one trial with the arm's settings
  applied and restored by the target itself, or TrialError with the
  environment it failed in;
- `attribute(arm, plan) -> {kind: data}`: the attribution runs of one arm,
  after the timing trials, never inside them.

`host` is the running kernel, `qemu` a kernel booted in a VM; tests plug in
a fake target of their own through `Lab`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from mmlab.errors import MmlabError
from mmlab.workloads.samples import Sample

if TYPE_CHECKING:
    from mmlab.experiment import Arm, Plan


@dataclass
class TrialResult:
    samples: list[Sample]
    environment: dict


class TrialError(MmlabError):
    """A failed trial, with the environment it failed in."""

    def __init__(self, message: str, environment: dict | None = None):
        super().__init__(message)
        self.environment = environment


class Target(Protocol):
    name: str

    def check(self, plan: Plan) -> None: ...

    def run_trial(self, arm: Arm, plan: Plan) -> TrialResult: ...

    def attribute(self, arm: Arm, plan: Plan) -> dict[str, dict]: ...


class Lab:
    """The targets of one run, one per place an arm names (`Arm.target`),
    made on first use and kept, so a guest kernel is fetched once."""

    def __init__(self, allow_host_changes: bool = False, say: Callable[[str], None] = print):
        self.allow_host_changes = allow_host_changes
        self.say = say
        self._made: dict[str, Target] = {}

    def target(self, arm: Arm) -> Target:
        if arm.target not in self._made:
            self._made[arm.target] = self._make(arm)
        return self._made[arm.target]

    def _make(self, arm: Arm) -> Target:
        from mmlab.targets.host import HostTarget
        from mmlab.targets.qemu import QemuTarget
        if arm.kernel == "host":
            return HostTarget(self.allow_host_changes)
        return QemuTarget(arm.kernel, self.say)
