"""Cells spread over a fleet's machines (`mmlab track run --machines`):
one block of cells (cells.blocks) per machine at a time, each block an
experiment of its own with the machine in its plan, run by the fleet's
coordinator (its worker runs the trials, the coordinator the looks and the
audit's controls), so the cells' time divides by the machines.  A block
keeps the machine it was planned on: an interrupted one is finished there.
Confirmations come after the cells they read and run where `track run`
runs.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from mmlab.errors import MmlabError
from mmlab.experiment.plan import with_kernels
from mmlab.store import Store
from mmlab.track import cells
from mmlab.track.cells import OnCell, Work

RunBatch = Callable[[list[int]], None]      # run these experiments at once, one per machine


def measure(store: Store, machines: list[str], run: RunBatch, work: list[Work],
            on_cell: OnCell) -> list[int]:
    """The cells of `work` in batches of one block per machine; returns
    their experiments."""
    label = secrets.token_hex(4)
    ran: list[int] = []
    done = 0
    found = cells.blocks(work)
    for start in range(0, len(found), len(machines)):
        ids = []
        for block, machine in zip(found[start:start + len(machines)], machines):
            on_cell(block.cells, done, len(work))
            done += len(block.cells)
            exp_id = block.experiment
            if exp_id is None:
                plan = with_kernels(cells.cell_plan(block.tracked), block.kernels, block.key)
                exp_id = store.create_experiment(
                    plan.model_copy(update={"machine": machine, "fleet": label}))
            ids.append(exp_id)
        run(ids)
        ran += ids
    return ran


def fleet_runner(store: Store, results: str, machines: list[str], allow_host_changes: bool,
                 say: Callable[[str], None]) -> RunBatch:
    """A RunBatch through the fleet's coordinator, once the store is the
    fleet's shared one and every machine is registered."""
    from mmlab.fleet import coordinator, registry
    if store.dir is not None:
        raise MmlabError(f"--machines needs the fleet's shared store: --results "
                         f"postgresql://... (not {store.where})")
    registry.lookup(store, machines)

    def run(ids: list[int]) -> None:
        coordinator.run(results, ids, allow_host_changes, lambda m, t, i, n: None,
                        lambda m, j: None, True, say)
    return run
