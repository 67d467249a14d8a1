"""Rich tables for the terminal, one module per subject: experiment (a
plan, samples, per-arm figures, verdicts and how a run went), attribution
(`mmlab explain`), kernels (the cache and the Debian catalog), machine
(workloads and the probe), fleet, census and selftest.  Here: the console
they print to, and the `say` that prints plain messages on it."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape


def console() -> Console:
    """Stdout; when it is not a terminal (logs, CI), wide enough for the tables."""
    import os
    import sys
    width = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 140
    return Console(highlight=False, width=width)


def plain(console: Console):
    """A `say` for the runner and the targets: their messages are plain text,
    so brackets in them (arm names like "A [control thp=nohugepage]") must
    not be read as markup."""
    return lambda message: console.print(escape(message))
