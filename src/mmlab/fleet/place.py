"""The fleet as a place for driver.run_experiment: a profile stored once per
machine and run by the machines' workers (coordinator.py), so `experiment
run --machines`, its resume and the tracker's batches go the same way as a
run here."""

from __future__ import annotations

from dataclasses import dataclass

from mmlab.errors import MmlabError
from mmlab.experiment.plan import Plan
from mmlab.fleet import coordinator
from mmlab.run import runner
from mmlab.run.events import OnEvent
from mmlab.store import Store


@dataclass
class Machines:
    """Fleet machines by name (`names`: those a new plan is stored for) in
    the shared store `results` (each machine's thread opens its own)."""
    results: str
    names: list[str]
    allow_host_changes: bool = False

    def check(self, plan: Plan, attribute: bool) -> None:
        if attribute:
            raise MmlabError("--attribute: attribution runs on one machine, not in fleet runs "
                             "(run the profile there with a results directory)")

    def create(self, store: Store, plan: Plan) -> list[int]:
        return coordinator.create(store, plan, self.names, self.allow_host_changes)

    def members(self, store: Store, exp_id: int) -> list[int]:
        return coordinator.members(store, exp_id)

    def run(self, store: Store, ids: list[int], with_controls: bool,
            on_event: OnEvent) -> dict[int, runner.RunResult]:
        return coordinator.run(self.results, ids, self.allow_host_changes, with_controls,
                               on_event)

    def attribute(self, store: Store, exp_id: int, plan: Plan, on_event: OnEvent) -> int:
        raise MmlabError("attribution runs on one machine, not on a fleet")
