"""`mmlab experiment plan|run|resume`: profiles run interleaved and resumably,
here or on fleet machines, and the verdicts printed from the run's own
last look."""

from __future__ import annotations

from pathlib import Path

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
from mmlab.errors import MmlabError
from mmlab.experiment import plan as experiment_plan
from mmlab.report import terminal
from mmlab.report.terminal import experiment
from mmlab.run import runner
from mmlab.store import Store
from mmlab.targets import TargetPool

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                  help="Run profiles: interleaved, repeated, resumable.")

MACHINES = typer.Option(None, "--machines", metavar="NAME,NAME",
                        help="run on these fleet machines (their workers), one experiment each, "
                             "verdicts per machine; needs a postgresql:// store")


def load(profile: Path, max_repetitions: int | None = None,
         budget: float | None = None) -> experiment_plan.Plan:
    """The profile's plan with the command line's limits."""
    return experiment_plan.with_limits(experiment_plan.load(profile), max_repetitions, budget)


@app.command("plan", epilog="Example: mmlab experiment plan experiments/pageout-thp-modes.toml")
def plan_cmd(profile: Path = PROFILE, max_repetitions: int = MAX_REPS,
             budget: float = BUDGET) -> None:
    """Expand PROFILE and show its arms, settings and schedule, and up to which
    noise its rounds reach a verdict (simulated); runs nothing."""
    from mmlab.report.terminal import selftest
    plan = load(profile, max_repetitions, budget)
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
    plan = load(profile, max_repetitions, budget)
    if machines is not None:
        start_fleet(plan, results, machines, allow_host_changes, attribute, not no_controls)
        return
    pool = TargetPool(allow_host_changes, say=terminal.plain(terminal.console()))
    pool.check(plan)
    for warning in plan.warnings():
        options.warn(warning)
    store = Store(results)
    exp_id = store.create_experiment(plan)
    p = plan.profile
    rounds = (f"{p.repetitions}" if p.rounds_at_most == p.repetitions
              else f"{p.repetitions} to {p.rounds_at_most}")
    typer.echo(f"experiment {exp_id}: {len(plan.arms)} arms x {rounds} rounds, seed {p.seed}, "
               f"store {store.where}", err=True)
    run_here(store, exp_id, plan, pool, attribute, not no_controls)


@app.command("resume", epilog="Example: mmlab experiment resume 3 --max-repetitions 25")
def resume_cmd(exp_id: int = EXPERIMENT, results: str = RESULTS,
               allow_host_changes: bool = ALLOW, attribute: bool = ATTRIBUTE,
               max_repetitions: int = MAX_REPS, budget: float = BUDGET,
               no_controls: bool = NO_CONTROLS) -> None:
    """Finish an interrupted experiment without repeating finished trials, and
    add rounds while its verdicts are undecided and its limits allow."""
    store = options.open_store(results)
    plan = store.plan(exp_id)
    experiment_plan.with_limits(plan, max_repetitions, budget)        # checked before stored
    if plan.machine:
        from mmlab.fleet import coordinator
        refuse_fleet_attribution(attribute)
        ids = coordinator.members(store, exp_id)
        for member in ids:
            store.set_limits(member, max_repetitions, budget)
        run_fleet(results, ids, allow_host_changes, not no_controls)
        return
    run_here(store, exp_id, store.set_limits(exp_id, max_repetitions, budget),
             TargetPool(allow_host_changes), attribute, not no_controls)


def run_here(store: Store, exp_id: int, plan: experiment_plan.Plan, pool: TargetPool,
             attribute: bool = False, with_controls: bool = True) -> None:
    """runner.run with a progress bar, then attribution if asked, then the
    run's verdicts; the experiment ID is the last line printed (exit status
    1 if a trial failed)."""
    out = terminal.console()
    with options.progress() as bar:
        task = bar.add_task("starting", total=len(plan.order))
        pool.say = terminal.plain(bar.console)

        def on_trial(trial, index, total):
            bar.update(task, completed=index, total=total,
                       description=f"trial {index + 1}/{total} arm {trial.arm}")

        def on_look(judged):
            if judged.next_rounds:
                pool.say(f"after {judged.rounds} rounds {len(judged.undecided)} comparison(s) "
                         f"undecided: rounds added up to {judged.next_rounds}")
        result = runner.run(store, exp_id, plan, pool, on_trial, on_look, with_controls)
    pool.say = terminal.plain(out)
    out.print(experiment.run_line(result))
    if attribute or result.plan.profile.attribute:
        n = runner.attribute(store, exp_id, result.plan, pool, say=pool.say)
        out.print(f"attribution stored for {n} arm(s): mmlab explain {exp_id}")
    for line in experiment.failed_lines(store.trials(exp_id, status="failed")):
        out.print(line)
    experiment.print_verdicts(out, exp_id, result.plan, result.measured, result.judgement)
    typer.echo(exp_id)
    exit_on_failed(store, [exp_id])


def exit_on_failed(store: Store, ids: list[int]) -> None:
    """Exit status 1 when any trial failed: its verdicts rest on fewer rounds
    than planned, or on none."""
    failed = sum(len(store.trials(e, status="failed")) for e in ids)
    if failed:
        typer.echo(f"mmlab: {failed} trial(s) failed (mmlab show {ids[0]}); exit status 1",
                   err=True)
        raise typer.Exit(1)


def refuse_fleet_attribution(attribute: bool) -> None:
    if attribute:
        raise MmlabError("--attribute: attribution runs on one machine, not in fleet runs "
                         "(run the profile there with a results directory)")


def start_fleet(plan: experiment_plan.Plan, results: str, machines: str, allow: bool,
                attribute: bool, with_controls: bool) -> None:
    """Plan one experiment per machine in the shared store and run them."""
    from mmlab import fleet
    from mmlab.fleet import coordinator
    names = fleet.machine_names(machines)
    refuse_fleet_attribution(attribute or plan.profile.attribute)
    for warning in plan.warnings():
        options.warn(warning)
    store = Store(results)
    ids = coordinator.create(store, plan, names, allow)
    typer.echo(f"fleet {store.plan(ids[0]).fleet}: experiments "
               + ", ".join(f"{e} on {m}" for e, m in zip(ids, names))
               + f"; store {store.where}", err=True)
    run_fleet(results, ids, allow, with_controls)


def run_fleet(results: str, ids: list[int], allow: bool, with_controls: bool) -> None:
    """Every machine's experiment at once, a progress bar each; then each
    machine's verdicts and where the change reproduced."""
    from mmlab.fleet import coordinator
    store = Store(results)
    out = terminal.console()
    with options.progress() as bar:
        say = terminal.plain(bar.console)
        bars = {p.machine: bar.add_task(p.machine, total=len(p.order))
                for p in (store.plan(e) for e in ids)}

        def on_trial(machine, trial, index, total):
            bar.update(bars[machine], completed=index, total=total,
                       description=f"{machine}: trial {index + 1}/{total} arm {trial.arm}")

        def on_look(machine, judged):
            if judged.next_rounds:
                say(f"{machine}: after {judged.rounds} rounds {len(judged.undecided)} "
                    f"comparison(s) undecided: rounds added up to {judged.next_rounds}")
        ran = coordinator.run(results, ids, allow, on_trial, on_look, with_controls, say)
    for exp_id in ids:
        result = ran[exp_id]
        out.print(experiment.run_line(result, f"machine {result.plan.machine}, "
                                              f"experiment {exp_id}: "))
        for line in experiment.failed_lines(store.trials(exp_id, status="failed")):
            out.print(line)
        experiment.print_verdicts(out, exp_id, result.plan, result.measured, result.judgement)
    print_fleet(store, ids)
    typer.echo(ids[0])
    exit_on_failed(store, ids)


def print_fleet(store: Store, ids: list[int]) -> None:
    from mmlab.fleet import summary
    from mmlab.report.terminal import fleet as fleet_tables
    found = summary.summarize(store, ids)
    out = terminal.console()
    for line in fleet_tables.machines_lines(found):
        out.print(line)
    out.print(fleet_tables.summary_table(found))
