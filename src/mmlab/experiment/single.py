"""`mmlab run`'s experiment: one arm, one trial of N samples, written as a
profile and read like any other.

Writing the command line out as TOML and parsing it gives `mmlab run` the
profile's validation (every value checked by mmwork, errors naming the
option), the same Plan, the same targets and the same store as `experiment
run`; the stored experiment's text is a profile that reproduces the run.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

import tomli_w

from mmlab import workloads
from mmlab.errors import MmlabError
from mmlab.experiment.plan import Plan, host_memory_mb, parse
from mmlab.experiment.profile import refuse_hidden
from mmlab.names import shown
from mmlab.workloads import execwork, insns

ARM = "run"


@dataclass
class Request:
    """What the command line asked for."""
    workload: str
    params: dict[str, object] = field(default_factory=dict)
    samples: int = 5
    kernel: str = "host"
    bare_metal: bool = False            # the kernel kexec'd on the bare-metal machine
    vcpus: int | None = None
    memory_mb: int | None = None
    numa_nodes: int | None = None
    count_insns: bool = False
    count_events: bool = False
    trace_count: tuple[str, ...] = ()
    trace_time: tuple[str, ...] = ()
    functions: int = 0
    # command, source, ...: profile keys as TOML holds them, their types by key
    exec_keys: dict[str, Any] = field(default_factory=dict)
    argv: tuple[str, ...] = ()          # the command line, for the profile's comment

    @property
    def attribute(self) -> bool:
        return bool(self.trace_count or self.trace_time or self.functions)


def check(req: Request) -> None:
    """Options that only a guest can honour are refused on the host or on
    bare metal, naming the option, rather than silently ignored; a guest
    larger than this machine is refused naming --memory-mb."""
    if req.bare_metal and req.kernel == "host":
        raise MmlabError("--bare-metal needs the kernel to kexec into (--kernel debian:7.3, say)")
    if req.kernel != "host" and not req.bare_metal:
        if req.memory_mb and req.memory_mb > (have := host_memory_mb()):
            raise MmlabError(f"--memory-mb {req.memory_mb}: more than this machine's {have} "
                             "MiB (MemTotal), which a guest's memory is taken from")
        return
    why = ("is for a guest: a bare-metal machine has the CPUs, memory and NUMA nodes it has, "
           "and no attribution runs there yet") if req.bare_metal else (
        "needs a guest kernel (--kernel debian:6.12, say): the host has the CPUs, memory and "
        "NUMA nodes it has, and no kprobes, function_graph or TCG plugin for mmlab (mmlab probe)")
    for option, value in (("--vcpus", req.vcpus), ("--memory-mb", req.memory_mb),
                          ("--numa-nodes", req.numa_nodes),
                          ("--trace-count", req.trace_count), ("--trace-time", req.trace_time),
                          ("--functions", req.functions), ("--events", req.count_events)):
        if value:
            raise MmlabError(f"{option} {why}")


def profile_text(req: Request, metrics: list[str]) -> str:
    """The request as a one-arm profile."""
    arm: dict[str, object] = {k: v for k, v in (("cpus", req.vcpus),
                                                ("numa_nodes", req.numa_nodes)) if v}
    doc: dict[str, object] = {
        "name": f"run {req.workload}", "workload": req.workload, "kernel": req.kernel,
        "repetitions": 1, "samples_per_trial": req.samples, "metrics": metrics,
        "baseline": ARM, "params": dict(req.params),
        "arms": [{"name": ARM, "set": arm}], **req.exec_keys}
    if req.memory_mb:
        doc["memory_mb"] = req.memory_mb
    if req.bare_metal:
        doc["bare_metal"] = True
    if req.attribute:
        doc.update(attribute=True, trace_count=list(req.trace_count),
                   trace_time=list(req.trace_time))
    # shown: a newline in an argument would end the comment, and what
    # follows would be read as the profile's own keys
    comment = "# " + shown(shlex.join(("mmlab", "run", *req.argv))) + "\n"
    return comment + tomli_w.dumps(doc)


def plan(req: Request) -> Plan:
    """The one-arm plan: every metric of the workload, its instruction
    metrics only with --insns (they cost a counting pass), refused on a
    host with no counter to count them (its trial would print none)."""
    check(req)
    refuse_hidden(req.exec_keys, "mmlab run")   # names an exec workload is built with
    wl = workload(req)
    for option, asked in (("--insns", req.count_insns), ("--functions", req.functions),
                          ("--events", req.count_events)):
        if asked and not wl.windows:
            raise MmlabError(f"{option}: {wl.name} has no timed windows to count")
    if req.count_insns and req.kernel == "host":
        ok, why = insns.perf_status()
        if not ok:
            raise MmlabError(f"--insns: {why} on this host; a guest counts its instructions "
                             "(--kernel debian:6.12, say)")
    counting = req.count_insns or req.count_events
    metrics = [m.name for m in wl.metrics if counting or m.unit != insns.UNIT]
    metrics += wl.event_metrics() if req.count_events else []
    return parse(profile_text(req, metrics), "mmlab run")


def workload(req: Request) -> workloads.Workload:
    """mmwork's workload by name, or the exec workload the exec keys make."""
    if req.workload != "exec":
        return workloads.get(req.workload)
    keys = dict(req.exec_keys)
    declared = {name: execwork.ExecMetric.model_validate(m)
                for name, m in keys.pop("exec_metrics", {}).items()}
    marked = {name: execwork.ExecWindow.model_validate(w)
              for name, w in keys.pop("windows", {}).items()}
    try:
        return execwork.build(keys.pop("command", []), declared=declared, windows=marked,
                              **keys)
    except execwork.ProfileKeyError as exc:
        raise MmlabError(f"{exc.key}: {exc}") from exc
