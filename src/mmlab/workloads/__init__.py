"""The workload registry: names, parameters, metrics and the mm paths they drive.

The C side is the single source of truth: `mmwork describe` prints the table
each workload declares, and this module turns it into typed records, checks
parameters against it and turns them into mmwork arguments.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.machine import proc
from mmlab.workloads.build import mmwork_path
from mmlab.workloads.samples import Sample

# Parameters the harness owns; runners set them, profiles do not.
HARNESS_PARAMS = ("samples", "warmups", "check", "own-memcg")

# Per stay metrics (a syscall, a page fault, another exception, an interrupt:
# workloads/syscalls.py): <window>_<stay>_<figure>, for any window.
# A stay's path may name a function on it, counted inclusively (calls=:
# attribution/functions.py): <stay>_incl_<function>.
# A path's stays follow the kernel's path; the clock's (interrupts taken in
# user mode, and the entries no symbol names) come as the host's clock
# paces them under TCG: the tracker follows no series of theirs, and the
# guest states audit judges none (clock_paced).
PATH_STAY = re.compile(r"syscall_[a-z0-9_]+|fault|exception_[a-z0-9_]+")
CLOCK_STAYS = ("interrupt", "other")
STAY = re.compile(rf"(?:{PATH_STAY.pattern}|{'|'.join(CLOCK_STAYS)})(?:_incl_[a-z0-9_]+)?")
STAY_HINT = re.compile(r"_(syscall|fault|exception|interrupt)(_|$)")
STAY_FORM = ("<window>_syscall_<name>_{calls,kernel_insns_per_call,kernel_insns_per_<unit>} "
             "(or fault, exception_<name>, interrupt in place of syscall_<name>; an event "
             "in place of insns)")
CALLS = "calls"
INSNS = "insns"     # the unit of every instruction count (insns.UNIT)

# What the QEMU plugin counts besides instructions (events=on: insns.py
# and qemu-plugin/events.h), as <window>_{kernel,user}_<event>_per_<unit>:
# each event's unit and what it counts.
EVENTS = {
    "loads": ("events", "memory loads"),
    "stores": ("events", "memory stores"),
    "load_bytes": ("bytes", "bytes loaded"),
    "store_bytes": ("bytes", "bytes stored"),
    "locked_insns": ("events", "locked instructions (a LOCK prefix, or xchg with memory)"),
    "invlpgs": ("events", "TLB invalidations by invlpg"),
    "invpcids": ("events", "TLB invalidations by invpcid"),
    "cr3_writes": ("events", "CR3 writes (an address space switch, flushing the TLB "
                   "unless its no-flush bit is set)"),
    "ipis": ("events", "IPIs sent (writes of the local APIC's interrupt command register)"),
    "string_insns": ("events", "rep-prefixed string instructions, once each"),
    "string_bytes": ("bytes", "bytes rep-prefixed string instructions stored or loaded"),
    "retired_insns": ("events", "instructions as a CPU's counter retires them (a rep string "
                      "instruction once, as perf's instructions)"),
}

# A count's name, read without its workload (a stored series, a trial's
# samples): <window>_{kernel,user}_<insns or an event>_per_<unit>, a stay's
# too, or a stay's calls.  With the workload at hand insns.counted says the
# same from its tables.
COUNT_NAME = re.compile(rf".+_(kernel|user)_({'|'.join((INSNS, *EVENTS))})_per_[a-z0-9_]+"
                        rf"|.+_({STAY.pattern})_{CALLS}")


def is_count(name: str) -> bool:
    """Is the metric `name` an exact count (instructions, an event, a stay's
    calls), judged by the count rule rather than as a time?"""
    return COUNT_NAME.fullmatch(name) is not None


# A clock's stay's figure, read without its workload (CLOCK_STAYS).
CLOCK_FIGURE = re.compile(rf".+_(?:{'|'.join(CLOCK_STAYS)})(?:_incl_[a-z0-9_]+)?"
                          rf"_(?:{CALLS}|kernel_[a-z0-9_]+_per_[a-z0-9_]+)")


def clock_paced(name: str) -> bool:
    """Is the metric `name` a figure of a stay the host's clock paces
    (CLOCK_STAYS), which says nothing of the kernel's path?"""
    return CLOCK_FIGURE.fullmatch(name) is not None


@dataclass(frozen=True)
class Param:
    name: str
    type: str          # int, size_kb, bytes, float, choice, flag, path
    default: str
    help: str
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    direction: str     # "higher" or "lower" is better
    help: str

    @property
    def higher_is_better(self) -> bool:
        return self.direction == "higher"


@dataclass(frozen=True)
class Window:
    """A timed window whose instructions can be counted (insns.py): its
    instruction metrics, per unit of work, as mmwork names them, and its CPU
    time metric ("" where another thread or process does its work)."""
    name: str
    unit: str          # what one window works on: page, op
    help: str
    kernel_metric: str
    user_metric: str
    marker: int = -1   # its id in the markers (core-insns.h); -1: its place in the table
    cpu_metric: str = ""


@dataclass(frozen=True)
class Workload:
    name: str
    seed: str
    summary: str
    params: tuple[Param, ...]
    metrics: tuple[Metric, ...]
    mm_paths: tuple[str, ...]
    vmstat: tuple[str, ...]
    tracepoints: tuple[str, ...]
    host_settings: tuple[str, ...]
    kind: str = "mmwork"   # or "exec" (execwork.ExecWorkload): how a stored Plan reads back
    windows: tuple[Window, ...] = ()
    scratch_disk: bool = False   # its --dir must keep a file's page cache droppable: a guest
                                 # mounts a disk-backed filesystem at /var/tmp (targets/qemu.py)

    def __post_init__(self) -> None:
        """mmwork's windows are marked by their place in its table: a window
        read from `describe`, or from a plan stored before windows carried
        their marker, gets it here."""
        placed = tuple(w if w.marker >= 0 else replace(w, marker=i)
                       for i, w in enumerate(self.windows))
        object.__setattr__(self, "windows", placed)

    def window_metrics(self) -> set[str]:
        """The instruction metrics of its windows."""
        return {m for w in self.windows for m in (w.kernel_metric, w.user_metric)}

    def cpu_metrics(self) -> set[str]:
        """Its windows' CPU time metrics (mmwork --cpu-time)."""
        return {w.cpu_metric for w in self.windows if w.cpu_metric}

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.params if p.name not in HARNESS_PARAMS)
        raise MmlabError(f"{self.name}: unknown parameter '{name}' (known: {known})")

    def metric(self, name: str) -> Metric:
        for m in self.metrics:
            if m.name == name:
                return m
        if found := self.stay_metric(name) or self.event_metric(name):
            return found
        if STAY_HINT.search(name):
            windows = ", ".join(w.name for w in self.windows) or "none"
            raise MmlabError(f"{self.name}: metric '{name}' is not {STAY_FORM} of a "
                             f"window it has (windows: {windows})")
        known = ", ".join(m.name for m in self.metrics)
        raise MmlabError(f"{self.name}: unknown metric '{name}' (known: {known})")

    def stay_metric(self, name: str) -> Metric | None:
        """The per-stay metric `name` names (a family no table lists: which
        syscalls a program makes is known only once it ran), or None."""
        found = self.stay_parts(name)
        return _stay_metric(name, *found) if found else None

    def stay_parts(self, name: str) -> tuple[Window, str, str] | None:
        """(window, stay, figure) of the per-stay metric `name`, or None."""
        for w in self.windows:
            rest = name.removeprefix(f"{w.name}_")
            for figure in (CALLS, *(f"kernel_{e}_per_{per}" for e in (INSNS, *EVENTS)
                                    for per in ("call", w.unit))):
                stay = rest.removesuffix(f"_{figure}")
                if rest != name and stay != rest and STAY.fullmatch(stay):
                    return w, stay, figure
        return None

    def event_of(self, name: str) -> tuple[Window, str, str] | None:
        """(window, side, event) of the event metric `name`, or None."""
        for w in self.windows:
            for side in ("kernel", "user"):
                event = name.removeprefix(f"{w.name}_{side}_").removesuffix(f"_per_{w.unit}")
                if event in EVENTS and name == _event_name(w, side, event):
                    return w, side, event
        if (stay := self.stay_parts(name)) and _figure_event(stay[2]) in EVENTS:
            return stay[0], "kernel", _figure_event(stay[2])     # a stay's kernel events
        return None

    def event_metrics(self) -> list[str]:
        """Every event metric of its windows (what `mmlab run --events` asks for)."""
        return [_event_name(w, side, e) for w in self.windows for side in ("kernel", "user")
                for e in EVENTS]

    def event_metric(self, name: str) -> Metric | None:
        """The event metric `name` names (EVENTS, of any window), or None:
        a family no table lists, since any window can count them."""
        if not (found := self.event_of(name)):
            return None
        w, side, event = found
        unit, what = EVENTS[event]
        return Metric(name, unit, "lower", f"{side} {what} per {w.unit} in the mean window "
                      f"{w.name} (counted exactly by QEMU's TCG plugin with events on, in a "
                      "counting pass)")

    def args(self, params: Mapping[str, object]) -> list[str]:
        """mmwork arguments for `params`, each name checked against the table."""
        out: list[str] = []
        for name, value in params.items():
            p = self.param(name)
            if p.type == "flag":
                if not isinstance(value, bool):
                    raise MmlabError(f"{self.name}: parameter '{name}' is a flag: "
                                     f"true or false, not {value!r}")
                if value:
                    out.append(f"--{name}")
                continue
            out += [f"--{name}", str(value)]
        return out


    def measured(self, sample: Sample) -> Sample:
        """The sample with the metrics the workload printed; mmwork's own
        workloads print them in the sample already (an exec workload parses
        its command's output here)."""
        return sample

    def programs(self, params: Mapping[str, object]) -> list[Path]:
        """Files it needs where it runs besides mmwork (a guest packs them)."""
        return []

    def check(self, params: Mapping[str, object]) -> None:
        """Validate values with mmwork's own rules (ranges, memory size, paths)."""
        checked = proc.call([mmwork_path(), self.name, *self.args(params), "--check"],
                            check=False)
        if checked.returncode:
            raise MmlabError(proc.last_words(checked, 1).removeprefix("mmwork: "))


def _event_name(window: Window, side: str, event: str) -> str:
    return f"{window.name}_{side}_{event}_per_{window.unit}"


def _figure_event(figure: str) -> str:
    """What a per-stay figure counts: insns, an event (EVENTS), or "" (calls)."""
    return figure.removeprefix("kernel_").rsplit("_per_", 1)[0] if figure != CALLS else ""


def _stay_metric(name: str, window: Window, stay: str, figure: str) -> Metric:
    """One per-stay metric, its help generated from its name."""
    stay, _, function = stay.partition("_incl_")
    what = {"fault": "page faults", "interrupt": "interrupts taken in user mode",
            "other": "kernel entries no symbol names"}.get(stay) or \
        stay.replace("syscall_", "the syscall ").replace("exception_", "the exception ")
    if function:
        what = f"{function} (inclusive: with all it calls) on the path of {what}"
    where = ("(the mean window), each from its entry to its return to user mode, "
             "interrupts inside it included (a counting pass)")
    if figure == CALLS:
        return Metric(name, CALLS, "lower", f"calls of {what} per {window.name} window {where}")
    per = figure.rsplit("_per_", 1)[1]
    unit, counted = EVENTS.get(_figure_event(figure), (INSNS, "instructions"))
    return Metric(name, unit, "lower",
                  f"kernel {counted} of {what} per {per} in window {window.name} {where}")


def _load(raw: list[dict]) -> dict[str, Workload]:
    table = {}
    for w in raw:
        if w.get("takes_command"):
            continue   # exec: a command's workload, made from a profile (execwork.py)
        table[w["name"]] = Workload(
            name=w["name"], seed=w["seed"], summary=w["summary"],
            params=tuple(Param(**{**p, "choices": tuple(p.get("choices", ()))})
                         for p in w["params"]),
            metrics=tuple(Metric(**m) for m in w["metrics"]),
            mm_paths=tuple(w["mm_paths"]), vmstat=tuple(w["vmstat"]),
            tracepoints=tuple(w["tracepoints"]),
            host_settings=tuple(w["host_settings"]),
            windows=tuple(Window(**x) for x in w.get("windows", [])),
            scratch_disk=w.get("scratch_disk", False))
    return table


@cache
def _described() -> list[dict]:
    return json.loads(proc.call([mmwork_path(), "describe"], what="mmwork describe").stdout)


def registry() -> dict[str, Workload]:
    """Every mm workload mmwork knows, by name (not exec, which runs a
    command and is made from a profile: execwork.py)."""
    return _load(_described())


def exec_table() -> dict:
    """mmwork exec's own table as `describe` prints it: its options and the
    vmstat counters it reports around a command."""
    return next(w for w in _described() if w.get("takes_command"))


def get(name: str) -> Workload:
    table = registry()
    if name not in table:
        raise MmlabError(f"unknown workload '{name}' (known: {', '.join(table)})")
    return table[name]
