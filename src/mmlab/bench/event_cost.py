"""`make bench`, events part: what counting events (the QEMU plugin's
events=on: loads, stores, locked instructions, TLB flushes, IPIs, string
instructions, retired instructions) costs a counted guest trial, beside the
same trial counting instructions alone, interleaved round by round.

Events take a callback on every block and every memory access where
instructions alone take an inline add per block (one vCPU), so the
emulated guest runs slower: the wall clock around the counting trial (what
a tracked cell pays) and each window's emulated time per page (what the
slowdown does inside the guest) are set side by side, as medians and
ratios to instructions alone, for the block events alone (events=blocks:
no memory callbacks) and for every event (events=on).  The trial is
pageout-refault's tracked shape (16 MiB, one sample, one warm-up).
"""

from __future__ import annotations

import time

from rich.table import Table

from mmlab import workloads
from mmlab.judge.stats import summarize
from mmlab.kernels import images, qemu_plugin
from mmlab.machine import knobs
from mmlab.machine.knobs import HostSettings
from mmlab.report.fmt import num
from mmlab.targets import qemu
from mmlab.targets.boot import Guest
from mmlab.workloads import insns

PARAMS = {"mapping-kb": 16384, "min-ms": 200}
WARMUPS = 1
ARGS = {"instructions": (), "and block events": ("events=blocks",),
        "and every event": ("events=on",)}
TRIAL = "trial wall s"


def _trial(guest: Guest, extra: tuple[str, ...]) -> dict[str, float]:
    """One counting trial: its wall clock, and its windows' emulated ns per page."""
    wl = workloads.get("pageout-refault")
    t0 = time.perf_counter()
    (s,) = qemu.sample(guest, wl, insns.counting_params(PARAMS), 1, WARMUPS, HostSettings(),
                       plugin=qemu_plugin.ensure(), plugin_extra=extra)
    found = {TRIAL: time.perf_counter() - t0}
    found.update({m: v for m, v in s.metrics.items()
                  if m.endswith("_ns_per_page") and v is not None})
    return found


def measure(kernel: str, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Per way of counting, each figure's values, interleaved round by round,
    under the machine lock."""
    guest = Guest(images.ensure(kernel))
    found: dict[str, dict[str, list[float]]] = {way: {} for way in ARGS}
    with knobs.machine_lock():
        _trial(guest, ())                           # the saved boot, made once
        for _ in range(rounds):
            for way, extra in ARGS.items():
                for figure, value in _trial(guest, extra).items():
                    found[way].setdefault(figure, []).append(value)
    return found


def table(kernel: str = "debian:6.12", rounds: int = 3) -> Table:
    found = measure(kernel, rounds)
    alone = found["instructions"]
    t = Table(title=f"counting events in a guest ({kernel}, TCG here): pageout-refault "
                    f"16 MiB, {rounds} interleaved rounds, medians")
    for col in ("figure", *ARGS, "ratios"):
        t.add_column(col, justify="left" if col == "figure" else "right")
    for figure in alone:
        medians = [summarize(found[way][figure]).median for way in ARGS]
        t.add_row(figure, *map(num, medians),
                  " ".join(f"{m / medians[0]:.2f}x" for m in medians[1:]))
    return t
