"""Rich tables for the terminal, one module per subject: experiment (a
plan, samples, per-arm figures, verdicts and how a run went), attribution
(`mmlab explain`), kernels (the cache and the Debian catalog), machine
(workloads and the probe), fleet, census and selftest; fit keeps a table's
columns whole at any width.  Here: the console they print to, and the
`say` that prints plain messages on it."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from mmlab.report.fmt import printable


def console() -> Console:
    """Stdout, as wide as the terminal that shows it: also when stdout is
    piped (`mmlab compare 1 | less`), where that terminal is stderr's; with
    no terminal at all (logs, CI), 140 columns.  COLUMNS overrides.  A table
    wider than that prints as records rather than lose columns (fit.py)."""
    import os
    import sys
    width = None
    if not sys.stdout.isatty() and "COLUMNS" not in os.environ:
        try:
            width = os.get_terminal_size(sys.stderr.fileno()).columns
        except (OSError, ValueError):       # stderr is no terminal, or not a file
            width = 140
    return Console(highlight=False, width=width)


def escaped(text: object) -> str:
    """A user-given name, or a text holding one, as a table or line prints
    it: its control and bidi characters escaped (fmt.printable) and its
    brackets not read as markup."""
    return escape(printable(text))


def plain(console: Console):
    """A `say` for the runner and the targets: their messages are plain text,
    so brackets in them (arm names like "A [control thp=nohugepage]") must
    not be read as markup."""
    return lambda message: console.print(escape(message))
