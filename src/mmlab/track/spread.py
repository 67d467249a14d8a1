"""The tracker's work spread over a fleet's machines (`mmlab track run
--machines`): cells one block (cells.blocks) per machine at a time, then
each series' confirmations the same way, each block or confirmation an
experiment of its own with the machine in its plan, run by the fleet's
coordinator (its worker runs the trials, the coordinator the looks and the
audit's controls), so the suite's time divides by the machines.  An
experiment keeps the machine it was planned on: an interrupted one is
finished there.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from mmlab.experiment.plan import Plan, with_kernels
from mmlab.run import driver
from mmlab.run.events import OnEvent
from mmlab.store import Store
from mmlab.track import cells
from mmlab.track.cells import OnCell, Work

RunBatch = Callable[[list[int]], None]      # run these experiments at once, one per machine


@dataclass
class Fleet:
    """Batches of experiments, one per machine, each batch run at once
    (`run`); a batch waits for its slowest experiment."""
    store: Store
    machines: list[str]
    run: RunBatch
    label: str = field(default_factory=lambda: secrets.token_hex(4))

    def cells(self, work: list[Work], on_cell: OnCell) -> list[int]:
        """The cells of `work`, block by block; returns their experiments."""
        found = cells.blocks(work)
        firsts = list(itertools.accumulate((len(b.cells) for b in found), initial=0))
        return self.experiments(
            [b.experiment if b.experiment is not None else
             with_kernels(cells.cell_plan(b.tracked), b.kernels, b.key) for b in found],
            lambda i: on_cell(found[i].cells, firsts[i], len(work)))

    def experiments(self, todo: list[Plan | int],
                    starting: Callable[[int], object] = lambda i: None) -> list[int]:
        """Each new plan stored on the machine of its place in its batch,
        each stored (unfinished) experiment on its own; all run, in order.
        `starting` hears each one's index as its batch starts."""
        ran: list[int] = []
        for start in range(0, len(todo), len(self.machines)):
            ids = []
            for i, machine in zip(range(start, len(todo)), self.machines):
                starting(i)
                item = todo[i]
                ids.append(self.store.create_experiment(item.model_copy(
                    update={"machine": machine, "fleet": self.label}))
                    if isinstance(item, Plan) else item)
            self.run(ids)
            ran += ids
        return ran


def fleet_runner(store: Store, results: str, machines: list[str], allow_host_changes: bool,
                 on_event: OnEvent) -> RunBatch:
    """A RunBatch through the fleet's machines (driver.run_experiment with
    the fleet as its place), once the store is the fleet's shared one and
    every machine is registered."""
    from mmlab.fleet import coordinator
    from mmlab.fleet.place import Machines
    coordinator.registered(store, machines)
    place = Machines(results, machines, allow_host_changes)

    def run(ids: list[int]) -> None:
        driver.run_experiment(store, ids, place, on_event=on_event)
    return run
