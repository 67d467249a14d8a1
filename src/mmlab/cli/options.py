"""Options several commands share, spelled once, with metavars a person reads."""

from __future__ import annotations

import sys

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from mmlab.report import terminal
from mmlab.store import Store

RESULTS = typer.Option("mmlab-results", "--results", parser=str, metavar="PATH",
                       help="the results directory holding the store, or a fleet's shared "
                            "store: postgresql://user@host/db")
ALLOW = typer.Option(False, "--allow-host-changes",
                     help="let arms and workloads change global settings (THP, KSM, swap, "
                          "sysctls); they are restored after each trial")
ATTRIBUTE = typer.Option(False, "--attribute",
                         help="after the timing trials, attribution trials (perf stacks, lock "
                              "waits, tracepoints; guest traces and instructions by function)")
MAX_REPS = typer.Option(None, "--max-repetitions", min=3, metavar="N",
                        help="rounds at most (overrides the profile's max_repetitions)")
BUDGET = typer.Option(None, "--budget", min=0.001, metavar="SECONDS",
                      help="seconds of trials after which no rounds are added (budget_s)")
NO_CONTROLS = typer.Option(False, "--no-controls",
                           help="do not add matched-state control arms for pairs the audit "
                                "finds in different page states")
JSON = typer.Option(False, "--json", help="print JSON instead of tables")
PROFILE = typer.Argument(..., metavar="PROFILE", help="a TOML profile (see docs/profiles.md)")
EXPERIMENT = typer.Argument(..., metavar="EXPERIMENT", help="an experiment ID (mmlab experiments)")


def open_store(results: str) -> Store:
    """The store of a command that only reads: it must exist already."""
    return Store(results, create=False)


def progress(disable: bool = False) -> Progress:
    """A progress bar on a terminal; nothing in logs and CI."""
    return Progress(TextColumn("{task.description}"), BarColumn(),
                    TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn(),
                    console=terminal.console(), disable=disable or not sys.stdout.isatty(),
                    transient=True)


def warn(message: str) -> None:
    typer.echo(f"mmlab: warning: {message}", err=True)
