"""`make bench`, guests part: a guest trial booted against the same trial
restored from a saved boot (targets/snapshot.py), interleaved, wall clock
around the whole trial as the runner calls it, as a ratio.

Two sizes: the smallest trial (a 1 MiB mapping, one sample, no warm-up),
which is all fixed cost, and a 16 MiB pageout-refault sample with one
warm-up, the shape of the tracked profiles.  The snapshot is made before
the timed rounds, as the first trial of a run makes it once.
"""

from __future__ import annotations

import time

from rich.table import Table

from mmlab import workloads
from mmlab.judge.stats import summarize
from mmlab.kernels import images
from mmlab.machine import knobs
from mmlab.machine.knobs import HostSettings
from mmlab.report.fmt import num
from mmlab.targets import qemu
from mmlab.targets.boot import Guest

SIZES = {"fixed cost (1 MiB, 1 sample, no warm-up)": ({"mapping-kb": 1024, "rounds": 2,
                                                        "min-ms": 0}, 0),
         "tracked shape (16 MiB, 1 sample, 1 warm-up)": ({"mapping-kb": 16384,
                                                          "min-ms": 200}, 1)}


def _trial(guest: Guest, params: dict, warmups: int) -> float:
    t0 = time.perf_counter()
    qemu.sample(guest, workloads.get("pageout-refault"), params, 1, warmups, HostSettings())
    return time.perf_counter() - t0


def measure(kernel: str, rounds: int) -> dict[tuple[str, str], list[float]]:
    """Seconds per trial for each (size, start), interleaved round by round,
    under the machine lock."""
    k = images.ensure(kernel)
    found: dict[tuple[str, str], list[float]] = {}
    with knobs.machine_lock():
        for size, (params, warmups) in SIZES.items():
            _trial(Guest(k), params, warmups)           # the snapshot, made once
            for _ in range(rounds):
                for start in ("boot", "snapshot"):
                    found.setdefault((size, start), []).append(
                        _trial(Guest(k, start=start), params, warmups))
    return found


def table(kernel: str = "debian:6.12", rounds: int = 5) -> Table:
    found = measure(kernel, rounds)
    t = Table(title=f"a guest trial ({kernel}, TCG here), booted vs restored: "
                    f"{rounds} interleaved rounds, medians")
    for col in ("trial", "booted s", "restored s", "booted / restored"):
        t.add_column(col, justify="left" if col == "trial" else "right")
    for size in SIZES:
        booted = summarize(found[(size, "boot")]).median
        restored = summarize(found[(size, "snapshot")]).median
        t.add_row(size, num(booted), num(restored), f"{booted / restored:.2f}x")
    return t
