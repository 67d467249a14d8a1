"""Options several commands share, spelled once, with metavars a person reads.

Like every command module, this one imports only typer (and plain
constants, experiment/limits.py) at its top: the library loads inside the
command that uses it, so `--version`, `--help`
and a one-line error start in a fraction of the time the statistics,
pydantic and rich would take to import."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from mmlab.experiment.limits import MAX_ROUNDS

if TYPE_CHECKING:
    from pathlib import Path

    from mmlab.experiment.plan import Plan
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
MAX_REPS = typer.Option(None, "--max-repetitions", min=3, max=MAX_ROUNDS, metavar="N",
                        help="rounds at most (overrides the profile's max_repetitions)")
BUDGET = typer.Option(None, "--budget", min=0.001, metavar="SECONDS",
                      help="seconds of trials after which no rounds are added (budget_s)")
NO_CONTROLS = typer.Option(False, "--no-controls",
                           help="do not add matched-state control arms for pairs the audit "
                                "finds in different page states")
JSON = typer.Option(False, "--json", help="print JSON instead of tables")
PROFILE = typer.Argument(..., metavar="PROFILE", help="a TOML profile (see docs/profiles.md)")
# The largest ID a store holds (SQLite's INTEGER, PostgreSQL's BIGINT): a
# larger one is refused as the argument it is, not as a database error.
MAX_ID = 2 ** 63 - 1


def experiment_id(text: str) -> int:
    """An experiment ID as typed: a whole number a store can hold."""
    if not text.isdigit() or not 1 <= int(text) <= MAX_ID:
        raise typer.BadParameter(f"{text!r}: an experiment ID is a number from 1 to {MAX_ID} "
                                 "(mmlab experiments lists them)")
    return int(text)


EXPERIMENT = typer.Argument(..., metavar="EXPERIMENT", parser=experiment_id,
                            help="an experiment ID (mmlab experiments)")


def load_profile(path: Path) -> Plan:
    """The profile's plan; a path that is no profile is refused before the
    profile's models are imported (experiment/source.py)."""
    from mmlab.experiment import source
    text = source.read(path)
    from mmlab.experiment import plan
    return plan.parse(text, str(path))


def open_store(results: str) -> Store:
    """The store of a command that only reads: it must exist already, and is
    opened for reading only, so one where this user cannot write (an
    archive, a read-only mount, a colleague's directory) is read all the same."""
    from mmlab.store import Store
    return Store(results, create=False, read_only=True)


def warn(message: str) -> None:
    typer.echo(f"mmlab: warning: {message}", err=True)
