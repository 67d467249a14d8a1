"""`make bench`, startup part: how long `mmlab` takes to answer when it has
nothing to run (its version, its help, a one-line error for bad input),
beside the Python interpreter alone and `git --version`, interleaved round
by round so a neighbour's burst hits every command alike.

A command's start is what a person waits for on every typo; it is spent
importing, so the figure says whether the command layer still imports only
what each command uses.  Wall clock of the whole process, as a shell sees it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from rich.table import Table

from mmlab.judge.stats import summarize
from mmlab.report.fmt import num

GOAL_S = 0.3          # the start a person does not notice (the command's whole process)


def commands() -> dict[str, list[str]]:
    """What is timed: mmlab's quick answers, and two floors to read them by."""
    mmlab = str(Path(sys.executable).with_name("mmlab"))
    found = {
        "python -c pass (the floor)": [sys.executable, "-c", "pass"],
        "mmlab --version": [mmlab, "--version"],
        "mmlab --help": [mmlab, "--help"],
        "mmlab experiment run missing.toml (bad input)": [
            mmlab, "experiment", "run", "/nonexistent/missing.toml"],
        "mmlab compare 1 --results missing (bad input)": [
            mmlab, "compare", "1", "--results", "/nonexistent/results"],
    }
    if shutil.which("git"):
        found["git --version (a peer)"] = ["git", "--version"]
    return found


def measure(rounds: int) -> dict[str, list[float]]:
    """Seconds per start of each command, one of each per round; the first
    round warms the page cache and is not kept."""
    found: dict[str, list[float]] = {}
    todo = commands()
    for r in range(rounds + 1):
        for name, argv in todo.items():
            t0 = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           check=False)
            if r:
                found.setdefault(name, []).append(time.perf_counter() - t0)
    return found


def table(rounds: int = 15) -> Table:
    found = measure(rounds)
    t = Table(title=f"starting mmlab (host, this machine): {rounds} interleaved rounds, "
                    f"seconds of the whole process")
    for col in ("command", "median s", "min s", "max s", f"median / {GOAL_S:g} s"):
        t.add_column(col, justify="left" if col == "command" else "right")
    for name, times in found.items():
        s = summarize(times)
        t.add_row(name, num(s.median), num(min(times)), num(max(times)),
                  f"{s.median / GOAL_S:.2f}x")
    return t
