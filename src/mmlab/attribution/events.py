"""Counts of the tracepoints a workload declares (vmscan, compaction, ksm, ...),
per event, from one run with those event systems enabled.  Events lost to a
wrapped ring buffer are counted too, so a truncated count says so."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from mmlab.attribution import tracefs

EVENT_NAME = re.compile(r"^\s*\S.*?\[\d+\]\s+\S+\s+[\d.]+: (\w+):", re.M)


def count(trace: str, system_of: dict[str, str]) -> Counter[str]:
    """'system:event' -> occurrences in a trace text."""
    out: Counter[str] = Counter()
    for name in EVENT_NAME.findall(trace):
        out[f"{system_of.get(name, '?')}:{name}"] += 1
    return out


@dataclass(frozen=True)
class EventCount:
    event: str            # system:event
    count: int
    per_unit: float       # per unit of work


class EventCounts(BaseModel):
    """What the tracepoint run stores for an arm: counts per event, how many
    were lost to a full buffer, and the work and metrics of that run."""
    systems: list[str]
    missing: list[str] = []          # declared systems this kernel lacks
    counts: dict[str, int]           # system:event -> occurrences, most first
    lost: int = 0
    units: float = 1.0
    unit: str = "sample"
    metrics: dict[str, float | None] = {}

    def rows(self) -> list[EventCount]:
        return [EventCount(name, n, n / self.units) for name, n in self.counts.items()]


def collect(tf: Path, systems: tuple[str, ...], run: Callable[[], None]) -> EventCounts | None:
    """Count the events of the declared `systems` this kernel has while `run` runs."""
    present = [s for s in systems if (tf / "events" / s / "enable").exists()]
    if not present:
        return None
    system_of = {ev.name: s for s in present for ev in (tf / "events" / s).iterdir()
                 if ev.is_dir()}
    trace, lost = tracefs.record(tf, [f"events/{s}/enable" for s in present], run)
    return EventCounts(systems=present, missing=[s for s in systems if s not in present],
                       counts=dict(count(trace, system_of).most_common()), lost=lost)
