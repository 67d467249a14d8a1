"""Attribution trials on the host: one run under perf, two under lock tracing,
one counting tracepoints.

These run after the timing trials, each in its own mmwork process, so no
probe ever touches a timing sample.  What they return is stored per arm.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from mmlab.attribution import events, locks, stacks
from mmlab.errors import MmlabError
from mmlab.machine import proc
from mmlab.workloads import Workload, mmwork
from mmlab.workloads.samples import Sample, work_units

PERF_FREQ = 2999   # odd, so sampling does not beat with the kernel's timers


def perf_stacks(wl: Workload, params: dict, cpus: str | None) -> dict:
    """Folded kernel+user stacks of one sample, cpu-clock sampled (software
    event: this machine has no hardware counters)."""
    if not shutil.which("perf"):
        raise MmlabError("perf is not installed (make setup installs linux-perf)")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp, "perf.data")
        prefix = ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(PERF_FREQ), "-g",
                  "-o", str(data), "--"]
        (sample,) = mmwork.sample(wl, params, samples=1, cpus=cpus, prefix=prefix)
        script = proc.call(["perf", "script", "-i", data, "-F", "comm,pid,tid,period,ip,sym"],
                           what="perf script")
    units, unit = work_units(sample)
    return stacks.StackProfile(folded=stacks.to_text(stacks.fold(script.stdout)), units=units,
                               unit=unit, metrics=sample.metrics).model_dump()


def lock_contention(wl: Workload, params: dict, cpus: str | None,
                    tf: Path | None) -> dict | None:
    """Both lock passes (tracefs at `tf`); the metrics of each run are kept
    to measure overhead."""
    if not tf or not (tf / "events/lock/contention_begin").is_dir():
        return None
    runs: list[Sample] = []
    found = locks.collect(tf, lambda: runs.extend(mmwork.sample(wl, params, samples=1, cpus=cpus)))
    return found.model_copy(update={"metrics_waits": runs[0].metrics,
                                    "metrics_stacks": runs[1].metrics}).model_dump()


def tracepoint_counts(wl: Workload, params: dict, cpus: str | None,
                      tf: Path | None) -> dict | None:
    """Counts of the workload's declared tracepoint systems in one run."""
    if not tf or not wl.tracepoints:
        return None
    runs: list[Sample] = []
    found = events.collect(tf, wl.tracepoints,
                           lambda: runs.extend(mmwork.sample(wl, params, samples=1, cpus=cpus)))
    if found is None:
        return None
    units, unit = work_units(runs[0])
    return found.model_copy(update={"units": units, "unit": unit,
                                    "metrics": runs[0].metrics}).model_dump()
