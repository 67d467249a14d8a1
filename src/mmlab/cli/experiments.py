"""`mmlab experiment plan|run|resume`: profiles run interleaved and resumably,
here or on fleet machines, and the verdicts printed from the run's own
last look."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from mmlab.cli import options
from mmlab.cli.options import (
    ALLOW,
    ATTRIBUTE,
    BUDGET,
    EXPERIMENT,
    MAX_REPS,
    NO_CONTROLS,
    PROFILE,
    RESULTS,
)

if TYPE_CHECKING:
    from mmlab.run import driver
    from mmlab.run.events import Created

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                  help="Run profiles: interleaved, repeated, resumable.")

MACHINES = typer.Option(None, "--machines", metavar="NAME,NAME",
                        help="run on these fleet machines (their workers), one experiment each, "
                             "verdicts per machine; needs a postgresql:// store")


@app.command("plan", epilog="Example: mmlab experiment plan experiments/pageout-thp-modes.toml")
def plan_cmd(profile: Path = PROFILE, max_repetitions: int = MAX_REPS,
             budget: float = BUDGET) -> None:
    """Expand PROFILE and show its arms, settings and schedule, and up to which
    noise its rounds reach a verdict (simulated); runs nothing."""
    plan = options.load_profile(profile)
    from mmlab.experiment import plan as experiment_plan
    from mmlab.report import terminal
    from mmlab.report.terminal import experiment, selftest
    plan = experiment_plan.with_limits(plan, max_repetitions, budget)
    terminal.console().print(experiment.plan_table(plan))
    info, warnings = selftest.decisions(plan)
    typer.echo(info)
    for warning in plan.warnings() + warnings:
        options.warn(warning)


@app.command("run", epilog="Example: mmlab experiment run experiments/aa-pageout.toml "
                           "&& mmlab compare 1")
def run_cmd(profile: Path = PROFILE, results: str = RESULTS, allow_host_changes: bool = ALLOW,
            attribute: bool = ATTRIBUTE, max_repetitions: int = MAX_REPS,
            budget: float = BUDGET, no_controls: bool = NO_CONTROLS,
            machines: str = MACHINES) -> None:
    """Expand PROFILE, store its plan, run it; prints the experiment ID last.
    With --machines, one experiment per machine, run by the machines' workers."""
    names = None
    if machines is not None:
        from mmlab import fleet
        names = fleet.machine_names(machines)
    plan = options.load_profile(profile)
    from mmlab.cli.display import run_and_print
    for warning in plan.warnings():
        options.warn(warning)
    run_and_print(results, plan, names, allow_host_changes,
                  _options(attribute, no_controls, max_repetitions, budget), _created)


@app.command("resume", epilog="Example: mmlab experiment resume 3 --max-repetitions 25")
def resume_cmd(exp_id: int = EXPERIMENT, results: str = RESULTS,
               allow_host_changes: bool = ALLOW, attribute: bool = ATTRIBUTE,
               max_repetitions: int = MAX_REPS, budget: float = BUDGET,
               no_controls: bool = NO_CONTROLS) -> None:
    """Finish an interrupted experiment without repeating finished trials, and
    add rounds while its verdicts are undecided and its limits allow."""
    from mmlab.cli.display import run_and_print
    on_fleet: list[str] | None = [] if options.open_store(results).plan(exp_id).machine \
        else None
    run_and_print(results, exp_id, on_fleet, allow_host_changes,
                  _options(attribute, no_controls, max_repetitions, budget))


def _options(attribute: bool, no_controls: bool, max_repetitions: int | None,
             budget: float | None) -> driver.Options:
    from mmlab.run import driver
    return driver.Options(attribute, not no_controls, max_repetitions, budget)


def _created(event: Created) -> None:
    """The new experiment and its shape; on a fleet, each machine's."""
    plans = [event.store.plan(e) for e in event.ids]
    if plans[0].machine:
        typer.echo(f"fleet {plans[0].fleet}: experiments "
                   + ", ".join(f"{e} on {p.machine}" for e, p in zip(event.ids, plans))
                   + f"; store {event.store.where}", err=True)
        return
    p = event.plan.profile
    rounds = (f"{p.repetitions}" if p.rounds_at_most == p.repetitions
              else f"{p.repetitions} to {p.rounds_at_most}")
    typer.echo(f"experiment {event.ids[0]}: {len(event.plan.arms)} arms x {rounds} rounds, "
               f"seed {p.seed}, store {event.store.where}", err=True)
