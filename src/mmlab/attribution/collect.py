"""Attribution trials on the host: one run under perf, two under lock tracing.

These run after the timing trials, each in its own mmwork process, so no
probe ever touches a timing sample.  What they return is stored per arm.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from .. import probe
from ..errors import MmlabError
from ..samples import Sample
from ..knobs import HostSettings
from ..targets import host, qemu
from ..workloads import Workload
from . import events, locks, stacks

PERF_FREQ = 2999   # odd, so sampling does not beat with the kernel's timers
GUEST_SAMPLES = 3  # one boot; several samples give compaction more chances to reach KSM pages


def work_units(sample: Sample) -> tuple[float, str]:
    """What one sample did, to put CPU time per unit of work: pages or ops."""
    for key in ("pages", "ops", "data_pages"):
        if sample.counts.get(key):
            return float(sample.counts[key]), key
    return 1.0, "sample"


def perf_stacks(wl: Workload, params: dict, cpus: str | None) -> dict:
    """Folded kernel+user stacks of one sample, cpu-clock sampled (software
    event: this machine has no hardware counters)."""
    if not shutil.which("perf"):
        raise MmlabError("perf is not installed (make setup installs linux-perf)")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp, "perf.data")
        prefix = ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(PERF_FREQ), "-g",
                  "-o", str(data), "--"]
        (sample,) = host.run(wl, params, samples=1, cpus=cpus, prefix=prefix)
        script = subprocess.run(["perf", "script", "-i", str(data), "-F",
                                 "comm,pid,tid,period,ip,sym"], capture_output=True, text=True)
        if script.returncode:
            raise MmlabError(f"perf script failed: {script.stderr.strip()[-200:]}")
    units, unit = work_units(sample)
    return {"folded": stacks.to_text(stacks.fold(script.stdout)), "units": units, "unit": unit,
            "event": "cpu-clock", "metrics": sample.metrics}


def lock_contention(wl: Workload, params: dict, cpus: str | None) -> dict | None:
    """Both lock passes; the metrics of each run are kept to measure overhead."""
    tf = probe.tracefs()
    if not tf or not (tf / "events/lock/contention_begin").is_dir():
        return None
    runs: list[Sample] = []
    found = locks.collect(tf, lambda: runs.extend(host.run(wl, params, samples=1, cpus=cpus)))
    return {**found.to_dict(), "metrics_waits": runs[0].metrics, "metrics_stacks": runs[1].metrics}


def tracepoint_counts(wl: Workload, params: dict, cpus: str | None) -> dict | None:
    """Counts of the workload's declared tracepoint systems in one run."""
    tf = probe.tracefs()
    if not tf or not wl.tracepoints:
        return None
    runs: list[Sample] = []
    found = events.collect(tf, wl.tracepoints,
                           lambda: runs.extend(host.run(wl, params, samples=1, cpus=cpus)))
    if found is None:
        return None
    units, unit = work_units(runs[0])
    return {**found, "units": units, "unit": unit, "metrics": runs[0].metrics}


def guest_trace(wl: Workload, params: dict, guest: qemu.Guest, settings: HostSettings,
                count: tuple[str, ...], time: tuple[str, ...]) -> dict:
    """One instrumented guest trial of GUEST_SAMPLES samples: calls of `count`
    and call times of `time` (default: the workload's declared mm paths,
    timing the first), over the whole trial."""
    count = count or wl.mm_paths
    time = time or wl.mm_paths[:1]
    got = qemu.run(guest, wl, params, samples=GUEST_SAMPLES, warmups=0, settings=settings,
                   instrument=qemu.Instrumentation(tuple(count), tuple(time)))
    sample = got[0]
    units = sum(work_units(s)[0] for s in got)
    unit = work_units(sample)[1]
    traced = {k: v for k, v in sample.counts.items() if k.startswith("trace_")}
    return {"trace": traced, "units": units, "unit": unit, "metrics": sample.metrics,
            "accelerator": sample.state.get("accelerator")}
