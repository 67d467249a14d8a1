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
from ..targets import host
from ..workloads import Workload
from . import locks, stacks

PERF_FREQ = 2999   # odd, so sampling does not beat with the kernel's timers


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
            "event": "cpu-clock"}


def lock_contention(wl: Workload, params: dict, cpus: str | None) -> dict | None:
    tf = probe.tracefs()
    if not tf or not (tf / "events/lock/contention_begin").is_dir():
        return None
    return locks.collect(tf, lambda: host.run(wl, params, samples=1, cpus=cpus)).to_dict()
