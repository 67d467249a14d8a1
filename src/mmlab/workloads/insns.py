"""Kernel and user instructions per unit of work, beside the times.

A TCG guest's times are emulated and noisy (robust CVs of 26-33 % at one
vCPU); the instructions a kernel path executes are not.  Each timed window a
workload declares (mmwork's `windows`: "advise", per "page") gets
`<window>_kernel_insns_per_<unit>` and `<window>_user_insns_per_<unit>`, the
mean window's instructions per unit, from one of two sources:

- perf: mmwork reads an instructions counter group (exclude_user /
  exclude_kernel) around each window, on a host with a PMU (or in a KVM
  guest with a vPMU);
- the TCG plugin (qemu_plugin.py): mmwork marks each window with a marker
  NOP and the plugin counts the guest's instructions between the markers.

Counts come from a separate, labelled pass: a second mmwork run on the host,
a second boot with the plugin loaded in a guest, whose instruction metrics
join the timing pass's samples by sample index (state `insns_source` says
from where).  The timing pass is then exactly what it was without counting:
the plugin slows TCG (pageout-refault's first touch by 11 % and its
MADV_PAGEOUT by 6 % with inline counts, by 44 % and 15 % with the per-vCPU
callbacks several vCPUs need; README).  A profile asks for counts by naming
an instruction metric; where no source exists, the metrics are absent,
never zero, and `insns_source` says why.

Events (workloads.EVENTS): a profile that names one of
`<window>_{kernel,user}_<event>_per_<unit>` (loads, stores and their bytes,
locked instructions, TLB invalidations, IPIs sent, rep string instructions
and their bytes, instructions as a CPU retires them) has its counting pass
load the plugin with `events=on` (qemu-plugin/events.h), and every window
gets every event.  They cost a callback per block and per memory access,
so they are counted only when asked for, and without the memory callbacks
(`events=blocks`: no loads, stores, bytes or IPIs) when none of those is
asked for (`make bench`, events part).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import struct
from collections.abc import Callable, Mapping

from mmlab.errors import MmlabError
from mmlab.workloads import CALLS, INSNS, Window, Workload
from mmlab.workloads.samples import Sample

UNIT = INSNS
SOURCE_KEY = "insns_source"
PLUGIN_KEY = "insns_plugin"   # the build of the TCG plugin that counted (qemu_plugin.build)
# The events the plugin counts in a memory callback, the costly ones
# (qemu-plugin/events.h's EV_MEMORY): counted only with events=on.
MEMORY_EVENTS = ("loads", "stores", "load_bytes", "store_bytes", "ipis", "string_bytes")


class Unavailable(MmlabError):
    """No instruction source here; the trial runs on without counts."""


def counted(workload: Workload, metric: str) -> bool:
    """Is `metric` one the counting pass gives: instructions, or a stay's calls?"""
    return workload.metric(metric).unit in (UNIT, CALLS) or \
        workload.event_metric(metric) is not None


def wanted(workload: Workload, metrics: list[str]) -> bool:
    """Does a profile measuring `metrics` ask for instruction counts?"""
    return any(counted(workload, m) for m in metrics)


def only(workload: Workload, metrics: list[str]) -> bool:
    """Does a profile measuring `metrics` ask for instruction counts and
    nothing else?  Its trials then run the counting pass alone (`alone`):
    a timing pass would measure what nobody judges."""
    return bool(metrics) and all(counted(workload, m) for m in metrics)


def from_pass(workload: Workload, metric: str) -> bool:
    """Is `metric`, found in a counting pass's sample, one of its counts (a
    window's instructions, or a stay's: syscalls.py) rather than a time?"""
    return metric in workload.window_metrics() or workload.stay_metric(metric) is not None \
        or workload.event_metric(metric) is not None


def events_arg(workload: Workload, metrics: list[str]) -> tuple[str, ...]:
    """The plugin's argument for the events a profile measuring `metrics`
    names: events=on where one takes a memory callback (MEMORY_EVENTS),
    events=blocks (the cheaper per-block ones alone) where none does,
    nothing without an event metric."""
    asked = {found[2] for m in metrics if (found := workload.event_of(m))}
    if not asked:
        return ()
    return ("events=on",) if asked & set(MEMORY_EVENTS) else ("events=blocks",)


def alone(counted: list[Sample], workload: Workload) -> list[Sample]:
    """The counting pass's samples as the trial's own, for a profile that
    asks for counts only: the times measured under counting are not the
    workload's (the plugin slows TCG), so only the instruction metrics are
    kept, and the label says no timing pass ran."""
    for s in counted:
        s.metrics = {k: v for k, v in s.metrics.items() if from_pass(workload, k)}
        s.state[SOURCE_KEY] = f"{s.state.get(SOURCE_KEY, 'none')}, counting pass alone"
    return counted


def counting_params(params: Mapping[str, object]) -> dict[str, object]:
    """The arm's parameters for the counting pass (mmwork --insns)."""
    return {**params, "insns": True}


def units_count(window: str) -> str:
    """The count mmwork gives each sample: the units one window works on."""
    return f"{window}_units"


def add_counts(timed: list[Sample], workload: Workload,
               counting_pass: Callable[[], list[Sample]]) -> None:
    """Run the counting pass and join its instruction metrics into `timed`,
    or label `timed` with why there are none."""
    try:
        counted = counting_pass()
    except Unavailable as exc:
        for s in timed:
            s.state[SOURCE_KEY] = f"none ({exc})"
        return
    join(timed, counted, workload)


def join(timed: list[Sample], counted: list[Sample], workload: Workload) -> None:
    """Each counting-pass sample's instruction metrics and window counts into
    the timing sample of the same index, labelled as a separate pass."""
    keys = {k for w in workload.windows for k in (f"{w.name}_windows", units_count(w.name))}
    for s, c in zip(timed, counted, strict=True):
        s.metrics.update({k: v for k, v in c.metrics.items() if from_pass(workload, k)})
        s.counts.update({k: v for k, v in c.counts.items()
                         if k in keys or k == "insns_windows_unmatched"})
        s.state[SOURCE_KEY] = f"{c.state.get(SOURCE_KEY, 'none')}, separate counting pass"
        if PLUGIN_KEY in c.state:
            s.state[PLUGIN_KEY] = c.state[PLUGIN_KEY]


def plugin_records(output: str, kind: str) -> list[dict]:
    """The plugin's JSON lines of one kind ("sample", "blocks", ...), in order."""
    return [r for r in map(json.loads, filter(None, output.splitlines())) if r["kind"] == kind]


def sample_records(output: str, counted: list[Sample]) -> list[dict]:
    """The plugin's per-sample records, one per sample mmwork printed."""
    records = plugin_records(output, "sample")
    if len(records) != len(counted):
        raise Unavailable(f"the QEMU plugin closed {len(records)} samples, mmwork printed "
                          f"{len(counted)}")
    return records


def from_plugin(workload: Workload, counted: list[Sample], output: str,
                build: str = "") -> None:
    """The plugin's per-sample records (one JSON line after each sample, in
    order) as the counted samples' instruction metrics, each sample naming
    the plugin's `build` (qemu_plugin.build) where given."""
    records = sample_records(output, counted)
    for s, r in zip(counted, records):
        for w in workload.windows:
            n, kernel, user = r["windows"][w.marker]
            units = s.counts.get(units_count(w.name))
            if n and units:
                s.metrics[w.kernel_metric] = kernel / n / units
                s.metrics[w.user_metric] = user / n / units
                s.metrics.update(event_metrics(w, r.get("events"), n * units))
        s.counts["insns_windows_unmatched"] = float(r["unmatched"])
        s.state[SOURCE_KEY] = "qemu tcg plugin"
        if build:
            s.state[PLUGIN_KEY] = build


def event_metrics(window: Window, counted: list[dict] | None, per: float) -> dict[str, float]:
    """A window's events (the record's "events", per window {event: [kernel,
    user]}; absent without events=on) per unit of the mean window."""
    pairs = counted[window.marker].items() if counted else ()
    return {f"{window.name}_{side}_{event}_per_{window.unit}": pair[i] / per
            for event, pair in pairs for i, side in enumerate(("kernel", "user"))}


# ---------------------------------------------------------------- perf here

PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}
PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS = 0, 1
DISABLED, EXCLUDE_USER, EXCLUDE_HV = 1 << 0, 1 << 4, 1 << 6
PERF_FLAG_FD_CLOEXEC = 1 << 3


def perf_status() -> tuple[bool, str]:
    """(can this process count kernel instructions, in words), by opening
    the counter mmwork opens: perf_event_open of PERF_COUNT_HW_INSTRUCTIONS
    excluding user.  A host without a PMU (perf offers cpu-clock only)
    fails here."""
    nr = PERF_EVENT_OPEN.get(platform.machine())
    if nr is None:
        return False, f"perf_event_open not known on {platform.machine()}"
    attr = ctypes.create_string_buffer(struct.pack(
        "=IIQQQQQIIQ", PERF_TYPE_HARDWARE, 64, PERF_COUNT_HW_INSTRUCTIONS, 0, 0, 0,
        DISABLED | EXCLUDE_USER | EXCLUDE_HV, 0, 0, 0), 64)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(nr, attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        return False, f"no hardware instruction counter (perf_event_open: {os.strerror(err)})"
    os.close(fd)
    return True, "perf instruction counters (kernel and user)"
