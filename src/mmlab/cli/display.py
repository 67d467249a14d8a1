"""What a command shows while experiments run, and what it prints after:
the one listener every running command hands to the run, and the one way
its outcome is printed.

A command makes one `Display` before it starts: its console carries both
the progress bars and the lines above them, so a target's message never
tears a bar, and nothing is swapped mid-run.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import typer

from mmlab.experiment.plan import Plan
from mmlab.report import terminal
from mmlab.report.terminal import experiment
from mmlab.run import driver
from mmlab.run.events import Created, Event, Looked, Message, Progressed, TrialStarting

if TYPE_CHECKING:
    from rich.progress import TaskID

    from mmlab.store import Store


class Display:
    """Progress bars (one per fleet machine, one for the tracker's cells) and
    messages, on a terminal; plain lines in logs and CI.  `stderr` sends the
    messages to stderr (a command whose stdout is data), `quiet` drops them.
    `created` renders the Created event, which each command says its way."""

    def __init__(self, stderr: bool = False, quiet: bool = False,
                 created: Callable[[Created], None] | None = None):
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
        self.out = terminal.console()
        self.stderr, self.quiet, self.created = stderr, quiet, created
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(),
                            TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn(),
                            console=self.out, disable=quiet or not sys.stdout.isatty(),
                            transient=True)
        self.tasks: dict[str, TaskID] = {}
        self.lock = threading.Lock()          # a fleet's machines report from their threads

    def __enter__(self) -> Display:
        self.bar.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.bar.stop()

    def say(self, text: str) -> None:
        """A line of plain text (never markup: arm names hold brackets)."""
        if self.quiet:
            return
        if self.stderr:
            typer.echo(text, err=True)
        else:
            self.out.print(terminal.escape(text))

    def __call__(self, event: Event) -> None:
        if isinstance(event, Message):
            self.say(event.text)
        elif isinstance(event, TrialStarting):
            where = f"{event.machine}: " if event.machine else ""
            self._update(event.machine or "trials", event.index, event.total,
                         f"{where}trial {event.index + 1}/{event.total} arm {event.trial.arm}")
        elif isinstance(event, Looked):
            self._looked(event)
        elif isinstance(event, Progressed):
            self._update("cells", event.done, event.total, event.what)
        elif isinstance(event, Created) and self.created:
            self.created(event)

    def _looked(self, event: Looked) -> None:
        judged = event.judgement
        if judged.next_rounds:
            where = f"{event.machine}: " if event.machine else ""
            self.say(f"{where}after {judged.rounds} rounds {len(judged.undecided)} "
                     f"comparison(s) undecided: rounds added up to {judged.next_rounds}")

    def _update(self, name: str, done: int, total: int, description: str) -> None:
        with self.lock:
            if name not in self.tasks:
                self.tasks[name] = self.bar.add_task(description, total=total)
        self.bar.update(self.tasks[name], completed=done, total=total,
                        description=terminal.escape(description))


def run_and_print(results: str, start: Plan | int, machines: list[str] | None,
                  allow_host_changes: bool, how: driver.Options,
                  created: Callable[[Created], None] | None = None) -> None:
    """driver.run_experiment here (machines None) or on the fleet's
    machines, shown as it goes and printed as it ended: what `experiment
    run|resume` and `ab` do."""
    from mmlab.targets import TargetPool
    show = Display(created=created)
    if machines is None:
        place: driver.Place = driver.Here(TargetPool(allow_host_changes, show.say))
    else:
        from mmlab.fleet.place import Machines
        place = Machines(results, machines, allow_host_changes)
    with show:
        outcome = driver.run_experiment(results, start, place, how, show)
    print_outcome(show, outcome)


def print_outcome(display: Display, outcome: driver.Outcome) -> None:
    """Each experiment's run in one line, its attribution, failed trials and
    verdicts; on a fleet, where the change reproduced; the first experiment
    ID last (exit status 1 if a trial failed)."""
    out = display.out
    for exp_id in outcome.ids:
        result = outcome.results[exp_id]
        machine = result.plan.machine
        out.print(experiment.run_line(result, f"machine {machine}, experiment {exp_id}: "
                                    if machine else ""))
        if exp_id in outcome.attributed:
            out.print(f"attribution stored for {outcome.attributed[exp_id]} arm(s): "
                      f"mmlab explain {exp_id}")
        for line in experiment.failed_lines(outcome.failed[exp_id]):
            out.print(line)
        experiment.print_verdicts(out, exp_id, result.plan, result.measured, result.judgement)
    if outcome.result.plan.machine:
        print_fleet(outcome.store, outcome.ids)
    typer.echo(outcome.exp_id)
    exit_on_failed(outcome)


def print_fleet(store: Store, ids: list[int]) -> None:
    """On which machines the change reproduced."""
    from mmlab.fleet import summary
    from mmlab.report.terminal import fleet as tables
    found = summary.summarize(store, ids)
    out = terminal.console()
    for line in tables.machines_lines(found):
        out.print(line)
    out.print(tables.summary_table(found))


def exit_on_failed(outcome: driver.Outcome) -> None:
    """Exit status 1 when any trial failed (its verdicts rest on fewer rounds
    than planned, or on none), or when attribution was asked for and no
    arm got any (the messages above say why for each)."""
    if outcome.failures:
        typer.echo(f"mmlab: {outcome.failures} trial(s) failed (mmlab show "
                   f"{outcome.exp_id}); exit status 1", err=True)
        raise typer.Exit(1)
    unattributed = [str(e) for e, arms in outcome.attributed.items() if not arms]
    if unattributed:
        typer.echo(f"mmlab: attribution asked for, but no arm of experiment "
                   f"{', '.join(unattributed)} got any; exit status 1", err=True)
        raise typer.Exit(1)
