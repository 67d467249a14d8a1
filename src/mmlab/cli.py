"""The `mmlab` command: parses arguments and calls the modules that do the work."""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from . import knobs, probe, workloads
from .errors import Interrupted, MmlabError
from .report import terminal
from .targets import host

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Reproduce, measure and explain Linux mm performance reports.")


@app.callback()
def _startup() -> None:
    """Before any command: undo what a crashed mmlab left changed."""
    try:
        restored = knobs.replay_orphaned()
    except MmlabError as exc:
        typer.echo(f"mmlab: warning: {exc}", err=True)
        return
    if restored:
        typer.echo("mmlab: an earlier run did not finish; restored: " + "; ".join(restored),
                   err=True)


@app.command("workloads")
def workloads_cmd(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """List the workloads: seed, parameters, metrics and mm paths."""
    table = workloads.registry()
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(w) for w in table.values()], indent=1))
        return
    terminal.console().print(terminal.workloads_table(list(table.values())))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(ctx: typer.Context,
        workload: str = typer.Argument(..., help="workload name (see `mmlab workloads`)"),
        reps: int = typer.Option(5, "--reps", min=1, help="samples, one mmwork process each"),
        as_json: bool = typer.Option(False, "--json",
                                     help="print the samples as JSON lines and nothing else"),
        allow_host_changes: bool = typer.Option(
            False, "--allow-host-changes",
            help="let a workload change global settings (ksm-rmap drives KSM); "
                 "they are restored afterwards")) -> None:
    """Run WORKLOAD on this kernel; workload parameters go as --name value."""
    wl = workloads.get(workload)
    params = wl.parse_cli(ctx.args)
    wl.check(params)
    if wl.host_settings and not allow_host_changes:
        raise MmlabError(f"{wl.name} changes {', '.join(wl.host_settings)} while it runs; "
                         "pass --allow-host-changes (they are restored afterwards)")
    samples = []
    progress = Progress(TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn(),
                        console=terminal.console(), disable=as_json or not sys.stdout.isatty(),
                        transient=True)
    with progress:
        task = progress.add_task(f"{wl.name}", total=reps)
        for _ in range(reps):
            for sample in host.run(wl, params, samples=1):
                samples.append(sample)
                if as_json:
                    typer.echo(sample.model_dump_json())
            progress.advance(task)
    if as_json:
        return
    out = terminal.console()
    out.print(terminal.samples_table(wl, samples))
    out.print(terminal.state_table(samples))
    out.print(terminal.vmstat_table(samples))


@app.command("probe")
def probe_cmd(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """What this machine offers and lacks, measured now."""
    facts = probe.facts()
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(f) for f in facts], indent=1))
        return
    terminal.console().print(terminal.probe_table(facts))


@app.command()
def restore() -> None:
    """Put back every global setting an interrupted mmlab left changed."""
    journal = knobs.Journal()
    if not journal.path.exists():
        typer.echo("nothing to restore")
        return
    done = journal.restore()
    typer.echo("restored: " + ("; ".join(done) if done else "(nothing had changed)"))


def _interrupt(_signo: int, _frame: object) -> None:
    raise Interrupted


def main() -> None:
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        app()
    except MmlabError as exc:
        typer.echo(f"mmlab: {exc}", err=True)
        sys.exit(2)
    except Interrupted:
        typer.echo("mmlab: interrupted; global settings restored", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
