"""`mmlab worker`, `mmlab fleet status|summary` and `mmlab store copy`: a lab
of many machines sharing one PostgreSQL store and one Redis broker."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from mmlab.cli import options
from mmlab.cli.options import EXPERIMENT, RESULTS
from mmlab.errors import MmlabError

if TYPE_CHECKING:
    from mmlab.store import Store

fleet_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="A lab of many machines: workers, queues, verdicts per machine.")
store_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                  help="The store itself.")
BROKER = typer.Option("redis://localhost:6379/0", "--broker", envvar="MMLAB_BROKER",
                      metavar="URL",
                      help="the fleet's broker (Redis); its queues hold the planned trials")


def worker(name: str = typer.Option(..., "--name", metavar="NAME",
                                    help="this machine's name in the fleet"),
           results: str = RESULTS, broker: str = BROKER,
           bare_metal: str | None = typer.Option(
               None, "--bare-metal", envvar="MMLAB_BARE_METAL", metavar="MACHINE",
               help="the bare-metal machine this worker drives, whose agent kexecs each "
                    "bare-metal trial's kernel: its machine file (box1.toml), or "
                    "simulated:KERNEL, a TCG guest standing in for one")) -> None:
    """Serve this lab machine: register its probe in the shared store, then
    run the trials of its own queue one at a time until stopped.

    Example: mmlab worker --name box1 --results postgresql://mmlab@db/mmlab"""
    from mmlab.fleet import worker as fleet_worker
    fleet_worker.serve(name, results, broker, bare_metal=bare_metal)


@fleet_app.command("status")
def status(results: str = RESULTS) -> None:
    """The registered machines: whether their workers answer, what waits in
    their queues, what they run now.

    Example: mmlab fleet status --results postgresql://mmlab@db/mmlab"""
    from mmlab.fleet import summary
    from mmlab.report import terminal
    from mmlab.report.terminal import fleet as fleet_tables
    store = _fleet_store(results)
    terminal.console().print(fleet_tables.status_table(summary.status(store)))


@fleet_app.command("summary")
def summary_cmd(exp_id: int = EXPERIMENT, results: str = RESULTS) -> None:
    """Each machine's verdicts side by side: where the change reproduced.

    Example: mmlab fleet summary 12 --results postgresql://mmlab@db/mmlab"""
    from mmlab.fleet import coordinator
    store = _fleet_store(results)
    if not store.plan(exp_id).fleet:
        raise MmlabError(f"experiment {exp_id} is not part of a fleet run (mmlab compare "
                         f"{exp_id} shows its verdicts)")
    from mmlab.cli.display import print_fleet
    print_fleet(store, coordinator.members(store, exp_id))


def _fleet_store(results: str) -> Store:
    """A fleet's shared store; a results directory has no machines."""
    store = options.open_store(results)
    if store.dir is not None:
        raise MmlabError(f"--results {results}: a results directory has no fleet; name the "
                         "fleet's store, a postgresql:// URL")
    return store


@store_app.command("copy")
def copy(source: str = typer.Argument(..., metavar="SOURCE",
                                      help="a results directory or postgresql:// URL"),
         destination: str = typer.Argument(..., metavar="DESTINATION",
                                           help="a results directory or postgresql:// URL")
         ) -> None:
    """Copy every experiment of SOURCE into DESTINATION (a results directory
    into a fleet's PostgreSQL, or back); ones already there are skipped.

    Example: mmlab store copy mmlab-results postgresql://mmlab@db/mmlab"""
    from mmlab.store import Store, transfer
    for line in transfer.copy(options.open_store(source), Store(destination)):
        typer.echo(line)
