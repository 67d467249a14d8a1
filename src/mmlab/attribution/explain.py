"""`mmlab explain`, as data: per arm, where the CPU time went and who waited
on which lock; between an arm and its baseline, which functions and vmstat
counters carry the difference.

Everything here returns typed records and prints nothing: the terminal,
text and HTML reports and the flame graphs (report/) render the same
Explanation, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np
from pydantic import BaseModel

from mmlab.attribution.events import EventCount, EventCounts
from mmlab.attribution.functions import FunctionChange, FunctionInsns, changes, moved
from mmlab.attribution.guest import GuestTrace, TraceFigure
from mmlab.attribution.locks import Contention, LockCaller, LockWaits
from mmlab.attribution.stacks import Delta, FunctionCost, StackProfile, diff, top_functions
from mmlab.experiment.plan import Plan, pairs
from mmlab.workloads.samples import Sample, work_units

CHANGE_THRESHOLD = 0.2    # counters per unit of work that differ by more are shown


class Attribution(BaseModel):
    """What the attribution trials stored for one arm, each kind typed;
    `load` reads it back from the store's {kind: JSON}."""
    stacks: StackProfile | None = None
    locks: Contention | None = None
    events: EventCounts | None = None
    guest_trace: GuestTrace | None = None
    functions: FunctionInsns | None = None


def load(stored: dict[str, dict[str, dict]]) -> dict[str, Attribution]:
    """Store.attributions() -> typed records per arm."""
    return {arm: Attribution.model_validate(kinds) for arm, kinds in stored.items()}


@dataclass(frozen=True)
class CountChange:
    """A vmstat counter or tracepoint whose count per unit of work changed."""
    counter: str
    per_unit: float
    per_unit_baseline: float


@dataclass(frozen=True)
class Overhead:
    collection: str       # perf sampling, tracepoint counts, lock waits, lock stacks
    metric: str
    ratio: float          # the metric under collection / its clean median


@dataclass(frozen=True)
class ArmExplanation:
    arm: str
    unit: str
    cpu_ns_per_unit: float
    top: list[FunctionCost]
    callers: list[LockCaller]
    lock_waits: list[LockWaits]
    overhead: list[Overhead]
    events: list[EventCount]
    events_lost: int


@dataclass(frozen=True)
class GuestExplanation:
    arm: str
    unit: str
    accelerator: str
    figures: list[TraceFigure]
    skipped: list[str]


@dataclass(frozen=True)
class CallPath:
    """What one stay (a syscall, page faults) ran, inclusively: its entry
    function's instructions per unit with everything it called, and the
    functions called inside it, each with its own callees (so they overlap
    and do not add up); beside the stay's own count, which also holds the
    kernel entry and exit code around the entry function, the interrupts
    taken there and what other tasks ran while it was switched out (the
    per-syscall metrics count stays).  The interrupts are counted apart
    (`interrupts`), so the stay less the entry's count and theirs is what
    neither holds; None where a record predates that (its functions'
    counts hold the interrupts that landed in them)."""
    stay: str                        # syscall_mprotect, fault, ...
    entry: str                       # __x64_sys_mprotect, or the stay's largest function
    per_unit: float
    per_unit_baseline: float | None
    stay_per_unit: float | None      # the stay's kernel instructions per unit, same boot
    stay_per_unit_baseline: float | None
    rows: list[FunctionChange]       # alone: the largest; paired: those that moved most
    interrupts: tuple[float, float] | None = None   # (taken, instructions) per unit in the stay
    interrupts_baseline: tuple[float, float] | None = None
    calls_per_unit: float | None = None             # the stay's calls per unit, same boot
    calls_per_unit_baseline: float | None = None

    def taken_per_call(self, baseline: bool = False) -> float | None:
        """Interrupts taken per call of the stay (None where unknown)."""
        irq, calls = ((self.interrupts_baseline, self.calls_per_unit_baseline) if baseline
                      else (self.interrupts, self.calls_per_unit))
        return irq[0] / calls if irq is not None and calls else None

    def rest(self, baseline: bool = False) -> float | None:
        """The stay's instructions per unit in neither its entry function's
        count nor its interrupts: the kernel entry and exit code and other
        tasks' runs while it was switched out (None where unknown)."""
        stay, entry, irq = ((self.stay_per_unit_baseline, self.per_unit_baseline,
                             self.interrupts_baseline) if baseline else
                            (self.stay_per_unit, self.per_unit, self.interrupts))
        return None if stay is None or entry is None or irq is None else stay - entry - irq[1]


@dataclass(frozen=True)
class WindowFunctions:
    """Kernel instructions per unit by function in one timed window of a
    guest arm (exact counts from the TCG plugin), against the baseline's
    when the baseline has them too.  Its totals are one attribution boot's
    (a boot of its own, counting by block); `counted` is the same window's
    kernel metric as the experiment's trials counted it, the median that
    `compare` judges, so a reader sees both and why they may differ."""
    arm: str
    baseline: str | None
    window: str
    unit: str
    kernel: float                   # the window's kernel instructions per unit
    kernel_baseline: float | None
    unresolved: float               # per unit in no function System.map knows
    rows: list[FunctionChange]      # largest by count (alone) or by change (pair)
    metric: str = ""                # the window's kernel metric (<window>_kernel_insns_per_<unit>)
    counted: float | None = None    # its median over the trials' samples; None: not counted
    counted_baseline: float | None = None
    judged: bool = False            # the profile names the metric: compare shows `counted`
    paths: list[CallPath] = field(default_factory=list)   # per syscall (and faults), inclusive

    @property
    def change(self) -> float | None:
        return None if self.kernel_baseline is None else self.kernel - self.kernel_baseline

    def gaps(self) -> dict[str, float]:
        """The attribution boot's totals relative to the trials' medians
        (+0.02: 2% more in the attribution boot), for the baseline and the
        arm where both figures exist."""
        return {side: total / median - 1 for side, total, median in (
            ("baseline", self.kernel_baseline, self.counted_baseline),
            ("arm", self.kernel, self.counted)) if total is not None and median}


@dataclass(frozen=True)
class PairExplanation:
    arm: str
    baseline: str
    unit: str
    cpu_ns_per_unit: float
    cpu_ns_per_unit_baseline: float
    deltas: list[Delta]
    vmstat: list[CountChange]
    events: list[CountChange]

    @property
    def cpu_change(self) -> float:
        return self.cpu_ns_per_unit - self.cpu_ns_per_unit_baseline


@dataclass(frozen=True)
class Explanation:
    arms: list[ArmExplanation]        # host arms with perf stacks, locks, events
    pairs: list[PairExplanation]      # each arm against its baseline, both attributed
    guests: list[GuestExplanation]    # guest arms' in-guest traces
    functions: list[WindowFunctions]  # guest arms' instructions by function, per window
    focus: str | None                 # stacks only through this function
    stacks: dict[str, StackProfile]   # per arm, what flame graphs are drawn from

    def to_json(self) -> dict:
        """The explanation without the raw stacks (the bundle keeps those)."""
        return {"focus": self.focus, "arms": [asdict(a) for a in self.arms],
                "pairs": [asdict(p) for p in self.pairs],
                "guest_traces": [asdict(g) for g in self.guests],
                "functions": [asdict(f) for f in self.functions]}


def _median(samples: list[Sample], metric: str) -> float | None:
    values = [v for s in samples if (v := s.metrics.get(metric)) is not None]
    return float(np.median(values)) if values else None


def overheads(a: Attribution, clean: list[Sample]) -> list[Overhead]:
    """Each collection run's metrics against the clean timing median of the arm."""
    runs = (("perf sampling", a.stacks and a.stacks.metrics),
            ("tracepoint counts", a.events and a.events.metrics),
            ("lock waits", a.locks and a.locks.metrics_waits),
            ("lock stacks", a.locks and a.locks.metrics_stacks))
    out = []
    for name, metrics in runs:
        for metric, value in (metrics or {}).items():
            base = _median(clean, metric)
            if value is not None and base:
                out.append(Overhead(name, metric, value / base))
    return out


def explain_arm(arm: str, a: Attribution, clean: list[Sample], n: int = 12,
                focus: str | None = None) -> ArmExplanation:
    folded = a.stacks.stacks(focus) if a.stacks else None
    locks = a.locks or Contention()
    return ArmExplanation(
        arm=arm, unit=a.stacks.unit if a.stacks else "sample",
        cpu_ns_per_unit=(sum(folded.values()) / a.stacks.units if folded and a.stacks
                         else float("nan")),
        top=top_functions(folded, n) if folded else [],
        callers=locks.caller_waits()[:8], lock_waits=locks.waits[:5],
        overhead=overheads(a, clean), events=a.events.rows()[:n] if a.events else [],
        events_lost=a.events.lost if a.events else 0)


def explain_guest(arm: str, t: GuestTrace) -> GuestExplanation:
    """In-guest counts and call times, also per unit of work."""
    return GuestExplanation(arm, t.unit, str(t.accelerator), t.figures(), t.skipped)


def _changed(a: dict[str, float], b: dict[str, float]) -> list[CountChange]:
    """Counters per unit of work that differ by more than CHANGE_THRESHOLD
    or are non-zero on one side only."""
    out = []
    for k in sorted(a.keys() | b.keys()):
        x, y = a.get(k, 0.0), b.get(k, 0.0)
        if (x > 0) != (y > 0) or (y and abs(x / y - 1) > CHANGE_THRESHOLD):
            out.append(CountChange(k, x, y))
    return out


def event_changes(a: Attribution, base: Attribution) -> list[CountChange]:
    """Tracepoints per unit of work that changed, in the same form as vmstat."""
    def per_unit(x: Attribution) -> dict[str, float]:
        return {e.event: e.per_unit for e in x.events.rows()} if x.events else {}
    return _changed(per_unit(a), per_unit(base))


def vmstat_changes(samples: list[Sample], base: list[Sample]) -> list[CountChange]:
    """Counters whose median per unit of work changed."""
    def per_unit(ss: list[Sample]) -> dict[str, float]:
        keys = {k for s in ss for k in s.vmstat_delta}
        return {k: float(np.median([s.vmstat_delta.get(k, 0) / work_units(s)[0] for s in ss]))
                for k in keys}
    return _changed(per_unit(samples), per_unit(base))


def explain_pair(arm: str, baseline: str, a: Attribution, base: Attribution,
                 samples: list[Sample], base_samples: list[Sample], n: int = 12,
                 focus: str | None = None) -> PairExplanation:
    sa, sb = a.stacks, base.stacks
    deltas, ca, cb = [], float("nan"), float("nan")
    if sa and sb:
        fa, fb = sa.stacks(focus), sb.stacks(focus)
        deltas = diff(fa, sa.units, fb, sb.units, n)
        ca, cb = sum(fa.values()) / sa.units, sum(fb.values()) / sb.units
    return PairExplanation(arm, baseline, sa.unit if sa else "sample", ca, cb, deltas,
                           vmstat_changes(samples, base_samples), event_changes(a, base))


def explain_functions(arm: str, f: FunctionInsns, baseline: str | None = None,
                      base: FunctionInsns | None = None, n: int = 12) -> list[WindowFunctions]:
    """Per window: the arm's largest functions, or with a baseline that
    counted the same window, the functions whose instructions moved most;
    and each syscall's inclusive path."""
    out = []
    for window, kernel in f.kernel.items():
        paired = base if base is not None and window in base.kernel else None
        rows = (changes(f, paired, window, n) if paired is not None else
                [FunctionChange(fn, v, 0.0) for fn, v in f.top(window, n)])
        out.append(WindowFunctions(arm, baseline if paired is not None else None, window,
                                   f.units[window], kernel,
                                   paired.kernel[window] if paired is not None else None,
                                   f.unresolved.get(window, 0.0), rows,
                                   paths=call_paths(f, paired, window, n)))
    return out


SYSCALL_ENTRIES = ("__x64_sys_", "__se_sys_", "__do_sys_")   # in order of preference


def _entry(stay: str, funcs: dict[str, float]) -> str:
    """The function a stay's path starts at: a syscall's own entry
    function, or the one that ran most inside the stay (a fault's
    exc_page_fault)."""
    name = stay.removeprefix("syscall_")
    return next((p + name for p in SYSCALL_ENTRIES if p + name in funcs),
                max(funcs, key=lambda k: (funcs[k], k)))


def call_paths(f: FunctionInsns, base: FunctionInsns | None, window: str,
               n: int) -> list[CallPath]:
    """Each syscall's and the faults' inclusive path in `window`, largest
    first: alone, the functions that ran most inside it; against a
    baseline, the functions whose inclusive counts moved most, renames
    paired."""
    pa = f.paths.get(window, {})
    pb = base.paths.get(window, {}) if base is not None else {}
    out = []
    for stay in (pa.keys() | pb.keys()):
        if not (stay.startswith("syscall_") or stay == "fault") or stay.endswith("_unnamed"):
            continue
        fa, fb = pa.get(stay, {}), pb.get(stay, {})
        entry = _entry(stay, fa | fb)
        sa = f.stays.get(window, {}).get(stay)
        sb = base.stays.get(window, {}).get(stay) if base is not None else None
        rows = (moved({k: v for k, v in fa.items() if k != entry},
                      {k: v for k, v in fb.items() if k != entry}, n) if base is not None else
                [FunctionChange(k, v, 0.0) for k, v in sorted(fa.items(), key=lambda kv: -kv[1])
                 if k != entry][:n])
        out.append(CallPath(stay, entry, fa.get(entry, 0.0),
                            fb.get(entry, 0.0) if base is not None else None,
                            sa[1] if sa else None, sb[1] if sb else None, rows,
                            _interrupts(f, window, stay),
                            _interrupts(base, window, stay) if base is not None else None,
                            sa[0] if sa else None, sb[0] if sb else None))
    return sorted(out, key=lambda p: (-max(p.per_unit, p.per_unit_baseline or 0.0), p.stay))


def _interrupts(f: FunctionInsns, window: str, stay: str) -> tuple[float, float] | None:
    """The interrupts taken inside `stay` (taken, instructions per unit),
    none where none landed; None where the record holds no interrupts of
    the window: counted before the plugin took them out of the functions'
    inclusive counts."""
    if window not in f.interrupts:
        return None
    taken, insns = f.interrupts[window].get(stay, (0.0, 0.0))
    return taken, insns


def _functions(plan: Plan, attributed: dict[str, Attribution], samples: dict[str, list[Sample]],
               n: int) -> list[WindowFunctions]:
    """Each counted arm against its baseline where both counted; an arm
    with no counted baseline on its own; each beside the trials' own count
    of its window."""
    counted = {arm: a.functions for arm, a in attributed.items() if a.functions}
    out, paired = [], set()
    for p in pairs(plan):
        a, b = counted.get(p.arm.name), counted.get(p.baseline.name)
        if a and b:
            out += explain_functions(p.arm.name, a, p.baseline.name, b, n)
            paired |= {p.arm.name, p.baseline.name}
    for arm, f in counted.items():
        if arm not in paired:
            out += explain_functions(arm, f, n=n)
    return [_beside_trials(plan, w, samples) for w in out]


def _beside_trials(plan: Plan, w: WindowFunctions,
                   samples: dict[str, list[Sample]]) -> WindowFunctions:
    """`w` with its window's kernel metric and that metric's median over
    each arm's samples, where the trials counted it."""
    metric = next((x.kernel_metric for x in plan.workload.windows if x.name == w.window), "")
    if not metric:
        return w
    return replace(w, metric=metric, judged=metric in plan.profile.metrics,
                   counted=_median(samples.get(w.arm, []), metric),
                   counted_baseline=_median(samples.get(w.baseline, []), metric)
                   if w.baseline else None)


def explain_experiment(plan: Plan, attributed: dict[str, Attribution],
                       samples: dict[str, list[Sample]], focus: str | None = None,
                       n: int = 12) -> Explanation:
    """Every explanation the stored attribution of one experiment supports."""
    guests = [explain_guest(arm, a.guest_trace) for arm, a in attributed.items() if a.guest_trace]
    arms = [explain_arm(arm, a, samples.get(arm, []), n=n, focus=focus)
            for arm, a in attributed.items() if a.stacks or a.locks or a.events]
    explained = [explain_pair(p.arm.name, p.baseline.name, attributed[p.arm.name],
                              attributed[p.baseline.name], samples.get(p.arm.name, []),
                              samples.get(p.baseline.name, []), n=n, focus=focus)
                 for p in pairs(plan)
                 if p.arm.name in attributed and p.baseline.name in attributed]
    return Explanation(arms, explained, guests, _functions(plan, attributed, samples, n), focus,
                       {arm: a.stacks for arm, a in attributed.items() if a.stacks})
