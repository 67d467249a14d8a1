"""Counts of the tracepoints a workload declares (vmscan, compaction, ksm, ...),
per event, from one run with those event systems enabled.  Events lost to a
wrapped ring buffer are counted too, so a truncated count says so."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from . import tracefs

EVENT_NAME = re.compile(r"^\s*\S.*?\[\d+\]\s+\S+\s+[\d.]+: (\w+):", re.M)


def count(trace: str, system_of: dict[str, str]) -> Counter[str]:
    """'system:event' -> occurrences in a trace text."""
    out: Counter[str] = Counter()
    for name in EVENT_NAME.findall(trace):
        out[f"{system_of.get(name, '?')}:{name}"] += 1
    return out


def collect(tf: Path, systems: tuple[str, ...], run: Callable[[], None]) -> dict | None:
    present = [s for s in systems if (tf / "events" / s / "enable").exists()]
    if not present:
        return None
    system_of = {ev.name: s for s in present for ev in (tf / "events" / s).iterdir()
                 if ev.is_dir()}
    trace, lost = tracefs.record(tf, [f"events/{s}/enable" for s in present], run)
    return {"systems": present, "missing": [s for s in systems if s not in present],
            "counts": dict(count(trace, system_of).most_common()), "lost": lost}
