"""`make bench`, census part: the census of every process beside `cat
/proc/*/maps`, timed the same way (wall clock around one complete call,
each a child process plus its reading, interleaved, medians), as a ratio.

The census must stay under 2 s on a loaded machine: it is taken every
half second while a command runs.  `cat` reads less (no anon_vma, no
grouping) and is the floor any census of every process pays.
"""

from __future__ import annotations

import subprocess
import time

from rich.table import Table

from mmlab.census import iterator, take
from mmlab.judge.stats import summarize
from mmlab.machine import knobs
from mmlab.report.fmt import num

LIMIT_S = 2.0


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _cat_maps() -> None:
    subprocess.run(["sh", "-c", "cat /proc/[0-9]*/maps > /dev/null 2>&1"], check=False)


def measure(rounds: int = 10) -> dict[str, list[float]]:
    """Seconds per call of each, interleaved round by round, under the
    machine lock (no mmlab timing runs beside it)."""
    calls = {"mmlab census --all (iterator, grouping, smaps of the 5 shown)":
             lambda: take.take(None, top=5),
             "the BPF iterator alone (mmcensus, parsed)": iterator.read,
             "cat /proc/*/maps": _cat_maps}
    found: dict[str, list[float]] = {k: [] for k in calls}
    with knobs.machine_lock():
        for fn in calls.values():      # warm: build mmcensus, page in the binaries
            fn()
        for _ in range(rounds):
            for name, fn in calls.items():
                found[name].append(_timed(fn))
    return found


def table(rounds: int = 10) -> Table:
    found = measure(rounds)
    census = take.take(None, top=5)
    floor = summarize(found["cat /proc/*/maps"]).median
    t = Table(title=f"census of every process: {len(census.processes):,} processes, "
                    f"{census.vmas:,} VMAs ({rounds} interleaved rounds, medians; "
                    f"limit {LIMIT_S:g} s)")
    for col in ("what", "median ms", "max ms", "x cat /proc/*/maps", f"under {LIMIT_S:g} s"):
        t.add_column(col, justify="left" if col == "what" else "right")
    for name, secs in found.items():
        s = summarize(secs)
        t.add_row(name, num(s.median * 1000), num(s.max * 1000), f"{s.median / floor:.1f}x",
                  "yes" if s.max < LIMIT_S else "NO")
    return t
