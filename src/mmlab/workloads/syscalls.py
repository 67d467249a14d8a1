"""Kernel instructions per syscall, page fault, exception and interrupt,
inside any counted window, with no marker in the program.

mmlab's QEMU plugin, given the kernel's entry points (`stays=`, qemu-plugin/
insns.c), splits each vCPU's kernel time into stays: from the first kernel
block after user code to the next user block.  A stay is a call of what
entered the kernel (a syscall, named by the `__x64_sys_NAME` function it
runs; a page fault; another exception; an interrupt taken in user mode);
an interrupt or a fault inside a syscall counts with the syscall.  A stay
counts in a window when the window was open when it began and still is
when it ends.  Per window and sample, each stay becomes

- `<window>_<stay>_calls`: calls per window (the mean window),
- `<window>_<stay>_kernel_insns_per_call`,
- `<window>_<stay>_kernel_insns_per_<unit>`: per unit of work of the window,

with `<stay>` one of syscall_NAME, fault, exception_NAME, interrupt, other
(an entry no symbol names).  With events counted too (insns.py), each stay
also gets `<window>_<stay>_kernel_<event>_per_{call,<unit>}`: the kernel
events its calls counted (an IPI sent inside `mprotect` is mprotect's).  A
stay the window never made is absent, never zero.  Counting stays costs a
callback per block, so a counting pass asks for it only when a profile
names one of these metrics (`wanted`).
"""

from __future__ import annotations

from mmlab.workloads import Workload, insns
from mmlab.workloads.samples import Sample


def wanted(workload: Workload, metrics: list[str]) -> bool:
    """Does a profile measuring `metrics` ask for per-stay counts?"""
    return any(workload.stay_metric(m) for m in metrics)


def from_plugin(workload: Workload, counted: list[Sample], output: str) -> None:
    """The plugin's per-sample stays (a "stays" list beside "windows" in
    each sample record, one {label: [calls, kernel insns]} per window) as the
    counted samples' per-stay metrics; nothing where the plugin counted none."""
    for s, r in zip(counted, insns.sample_records(output, counted), strict=True):
        if "stays" in r:
            s.metrics.update(metrics(workload, s, r))


def metrics(workload: Workload, sample: Sample, record: dict) -> dict[str, float]:
    """One sample record's stays as metrics, per window that ran."""
    out: dict[str, float] = {}
    for w in workload.windows:
        windows = record["windows"][w.marker][0]
        units = sample.counts.get(insns.units_count(w.name))
        events = record["stay_events"][w.marker] if "stay_events" in record else {}
        for stay, (calls, kernel) in record["stays"][w.marker].items():
            if not windows or not calls:
                continue
            out[f"{w.name}_{stay}_calls"] = calls / windows
            for figure, n in {"insns": kernel, **events.get(stay, {})}.items():
                out[f"{w.name}_{stay}_kernel_{figure}_per_call"] = n / calls
                if units:
                    out[f"{w.name}_{stay}_kernel_{figure}_per_{w.unit}"] = n / windows / units
    return out

