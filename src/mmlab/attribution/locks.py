"""Lock contention from the lock:contention_begin/end tracepoints.

Two passes, because capturing a stack inside the waiter inflates the wait it
is measuring (about 34 us per event on this machine's kernel): the first pass
records bare begin/end events and pairs them per task into waits per lock;
the second records contention_begin with a stack trace after each event (the
`stacktrace` trace option; hist triggers would be cheaper but this host's
kernel lacks CONFIG_HIST_TRIGGERS) and counts contentions per calling chain.
When the ring buffer wraps, the callers are a sample of the latest events;
`stacks_seen` says how many.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from mmlab.attribution import tracefs

EVENT = re.compile(r"-(\d+)\s+\[\d+\]\s+\S+\s+([\d.]+): contention_(begin|end): (\S+)")
# Frames that are the locking machinery itself, not who asked for the lock.
LOCK_INTERNAL = re.compile(r"(trace_event|^_raw_|queued_spin|__pv_queued|native_queued|"
                           r"do_raw_|rwsem_down|__down|mutex_lock|osq_lock|__mutex|"
                           r"contention|^lock_acquire)")


@dataclass
class LockWaits:
    lock: str
    count: int = 0
    total_us: float = 0.0
    max_us: float = 0.0


def pair_waits(trace: str) -> list[LockWaits]:
    """Pair begin/end per task into waits, aggregated per lock address."""
    open_: dict[str, tuple[str, float]] = {}
    per_lock: dict[str, LockWaits] = {}
    for m in EVENT.finditer(trace):
        pid, ts, kind, lock = m.group(1), float(m.group(2)), m.group(3), m.group(4)
        if kind == "begin":
            open_[pid] = (lock, ts)
        elif pid in open_:
            lk, t0 = open_.pop(pid)
            w = per_lock.setdefault(lk, LockWaits(lk))
            us = (ts - t0) * 1e6
            w.count += 1
            w.total_us += us
            w.max_us = max(w.max_us, us)
    return sorted(per_lock.values(), key=lambda w: w.total_us, reverse=True)


def callers_from_stacks(trace: str, depth: int = 3) -> Counter[str]:
    """Stack-trace blocks after contention_begin -> counts per caller chain
    ("folio_lruvec_lock_irqsave <- folio_batch_move_lru <- lru_add_drain_cpu")."""
    out: Counter[str] = Counter()
    for block in trace.split("<stack trace>")[1:]:
        frames = []
        for line in block.splitlines()[1:]:
            if not line.startswith(" => "):
                break
            frames.append(line[4:].split("+")[0].strip())
        callers = [f for f in frames if not LOCK_INTERNAL.search(f)]
        if callers:
            out[" <- ".join(callers[:depth])] += 1
    return out


@dataclass(frozen=True)
class LockCaller:
    caller: str          # "folio_lruvec_lock_irqsave <- folio_batch_move_lru <- ..."
    seen: int            # contentions with this chain in the stacks pass
    wait_us: float       # estimated: the waits pass's total, shared by `seen`


class Contention(BaseModel):
    """What the two lock passes store for an arm, with the metrics of each
    run (to show what collection cost)."""
    waits: list[LockWaits] = []
    callers: dict[str, int] = {}
    metrics_waits: dict[str, float | None] = {}
    metrics_stacks: dict[str, float | None] = {}

    @property
    def stacks_seen(self) -> int:
        return sum(self.callers.values())

    def caller_waits(self) -> list[LockCaller]:
        """Callers, most seen first, with the total wait of pass 1 shared out
        by each caller's share of the stacks of pass 2."""
        total = sum(w.total_us for w in self.waits)
        seen = self.stacks_seen or 1
        return [LockCaller(c, n, total * n / seen) for c, n in Counter(self.callers).most_common()]


ENABLES = ["events/lock/contention_begin/enable", "events/lock/contention_end/enable"]


def collect(tf: Path, run: Callable[[], None]) -> Contention:
    """Run the workload twice under the two passes and return what they saw."""
    waits, _ = tracefs.record(tf, ENABLES, run)
    stacks, _ = tracefs.record(tf, ENABLES[:1], run, stacktrace=True)
    return Contention(waits=pair_waits(waits), callers=callers_from_stacks(stacks))
