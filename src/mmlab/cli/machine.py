"""`mmlab workloads`, `probe`, `restore` and `selftest`: what this machine and
mmlab offer, and putting global settings back."""

from __future__ import annotations

from pathlib import Path

import typer

from mmlab.cli import options
from mmlab.cli.options import JSON

selftest_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                  help="How well mmlab's own methods work.")


def header() -> None:
    """Print mmlab.h, the header a program includes to mark its own windows
    for counting (MMLAB_BEGIN(1) ... MMLAB_END(1)); permissively licensed.

    Example: mmlab header > mmlab.h"""
    from mmlab.workloads import csource
    typer.echo(csource.HEADER.read_text(), nl=False)


def workloads_cmd(as_json: bool = JSON) -> None:
    """List the workloads: seed, parameters, metrics and mm paths.

    Example: mmlab workloads --json"""
    from mmlab import workloads
    from mmlab.report import json as report_json
    from mmlab.report import terminal
    from mmlab.report.terminal import machine as machine_tables
    table = workloads.registry()
    if as_json:
        typer.echo(report_json.records(table.values()))
        return
    terminal.console().print(machine_tables.workloads_table(list(table.values())))
    typer.echo("and exec: any command or C file as a workload (mmlab run exec -- CMD ARGS..., "
               "mmlab run exec --source repro.c; profiles with workload = \"exec\")")
    typer.echo("and per syscall, page fault, exception and interrupt in any timed window: "
               f"{workloads.STAY_FORM}, counted in TCG guests")
    typer.echo("and events in any timed window: <window>_{kernel,user}_<event>_per_<unit>, "
               f"<event> one of {', '.join(workloads.EVENTS)}, counted in TCG guests")


def probe_cmd(as_json: bool = JSON) -> None:
    """What this machine offers and lacks, measured now.

    Example: mmlab probe"""
    from mmlab.report import json as report_json
    from mmlab.report import terminal
    from mmlab.report.terminal import machine as machine_tables
    from mmlab.targets import probe
    facts = probe.facts()
    if as_json:
        typer.echo(report_json.records(facts))
        return
    terminal.console().print(machine_tables.probe_table(facts))


def restore() -> None:
    """Put back every global setting an interrupted mmlab left changed.

    Example: mmlab restore"""
    from mmlab.machine import knobs
    journal = knobs.Journal()
    if not journal.path.exists():
        typer.echo("nothing to restore")
        return
    done = journal.restore()
    typer.echo("restored: " + ("; ".join(done) if done else "(nothing had changed)"))


@selftest_app.command("verdicts")
def selftest_verdicts(experiments: int = typer.Option(2000, "--experiments", min=10,
                                                      metavar="N",
                                                      help="simulated profiles per cell"),
                      seed: int = typer.Option(1, "--seed", metavar="N",
                                               help="the simulation's random seed"),
                      profile: Path = typer.Option(None, "--profile", metavar="PROFILE",
                                                   help="simulate this profile's shape: its "
                                                        "arms, pairs, metrics, rounds, looks, "
                                                        "criteria and schedule")) -> None:
    """The verdicts' operating characteristics by simulation, at the defaults or
    for one profile: false alarms, "no change" in A/A runs, changes inside the
    tolerance called, power and rounds used, per test and per profile, under
    noise that follows the schedule; exit status 1 when a goal is missed.

    Example: mmlab selftest verdicts --profile experiments/pageout-thp-modes.toml"""
    from mmlab.judge.selftest import DEFAULTS, Shape
    from mmlab.report.terminal import selftest as selftest_report
    shape = Shape.of(options.load_profile(profile)) if profile else DEFAULTS
    if selftest_report.print_report(experiments, seed, shape):
        raise typer.Exit(1)
