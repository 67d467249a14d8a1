"""`mmlab explain`: per arm, where the CPU time went and who waited on which
lock; between an arm and its baseline, which functions and vmstat counters
carry the difference."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .. import verdicts
from ..experiment import Plan
from ..report import flamegraph
from ..samples import Sample
from . import stacks
from .collect import work_units
from .locks import Contention


@dataclass(frozen=True)
class VmstatChange:
    counter: str
    per_unit: float
    per_unit_baseline: float


@dataclass(frozen=True)
class Overhead:
    collection: str       # perf, lock waits, lock stacks
    metric: str
    ratio: float          # the metric under collection / its clean median


def overheads(arm_data: dict, clean: list[Sample]) -> list[Overhead]:
    """Each collection run's metrics against the clean timing median of the arm."""
    runs = (("perf sampling", arm_data.get("stacks", {}).get("metrics")),
            ("tracepoint counts", arm_data.get("events", {}).get("metrics")),
            ("lock waits", arm_data.get("locks", {}).get("metrics_waits")),
            ("lock stacks", arm_data.get("locks", {}).get("metrics_stacks")))
    out = []
    for name, metrics in runs:
        for metric, value in (metrics or {}).items():
            base = [s.metrics.get(metric) for s in clean if s.metrics.get(metric) is not None]
            if value is not None and base and np.median(base):
                out.append(Overhead(name, metric, float(value / np.median(base))))
    return out


@dataclass
class ArmExplanation:
    arm: str
    unit: str
    cpu_ns_per_unit: float
    top: list[stacks.FunctionCost]
    callers: list[tuple[str, int, float]]
    lock_waits: list[dict]
    overhead: list[Overhead]
    events: list[tuple[str, int, float]]   # (system:event, count, per unit of work)
    events_lost: int


@dataclass
class GuestTrace:
    arm: str
    unit: str
    accelerator: str
    rows: list[tuple[str, str, float, float]]   # (figure, function, value, per unit)
    skipped: list[str]


def guest_trace(arm: str, data: dict) -> GuestTrace | None:
    """In-guest counts and call times, also per unit of work."""
    t = data.get("guest_trace")
    if not t:
        return None
    rows, skipped = [], []
    for key, value in sorted(t["trace"].items()):
        what, _, func = key.partition(".")
        if what == "trace_skipped":
            skipped.append(func)
        else:
            rows.append((what.removeprefix("trace_"), func, value, value / t["units"]))
    return GuestTrace(arm, t["unit"], str(t.get("accelerator")), rows, skipped)


@dataclass
class PairExplanation:
    arm: str
    baseline: str
    unit: str
    cpu_ns_per_unit: float
    cpu_ns_per_unit_baseline: float
    deltas: list[stacks.Delta]
    vmstat: list[VmstatChange]
    events: list[VmstatChange]


def _folded(data: dict, focus: str | None):
    if "stacks" not in data:
        return None
    folded = stacks.from_text(data["stacks"]["folded"])
    return stacks.focus(folded, focus) if focus else folded


def explain_arm(arm: str, data: dict, clean: list[Sample], n: int = 12,
                focus: str | None = None) -> ArmExplanation:
    folded = _folded(data, focus)
    units = data.get("stacks", {}).get("units", 1.0)
    locks = Contention.from_dict(data["locks"]) if "locks" in data else Contention()
    return ArmExplanation(
        arm=arm, unit=data.get("stacks", {}).get("unit", "sample"),
        cpu_ns_per_unit=sum(folded.values()) / units if folded else float("nan"),
        top=stacks.top_functions(folded, n) if folded else [],
        callers=locks.caller_wait_us()[:8], lock_waits=[w.__dict__ for w in locks.waits[:5]],
        overhead=overheads(data, clean), events=event_rows(data)[:n],
        events_lost=data.get("events", {}).get("lost", 0))


def event_rows(data: dict) -> list[tuple[str, int, float]]:
    ev = data.get("events")
    if not ev:
        return []
    return [(name, n, n / ev["units"]) for name, n in ev["counts"].items()]


def event_changes(data: dict, base_data: dict, threshold: float = 0.2) -> list[VmstatChange]:
    """Tracepoints whose count per unit of work differs by more than `threshold`
    (or fired on one side only), in the same form as the vmstat changes."""
    a = {name: per for name, _, per in event_rows(data)}
    b = {name: per for name, _, per in event_rows(base_data)}
    return [VmstatChange(k, a.get(k, 0.0), b.get(k, 0.0)) for k in sorted(a.keys() | b.keys())
            if (a.get(k, 0) > 0) != (b.get(k, 0) > 0)
            or (b.get(k) and abs(a.get(k, 0) / b[k] - 1) > threshold)]


def vmstat_changes(samples: list[Sample], base: list[Sample],
                   threshold: float = 0.2) -> list[VmstatChange]:
    """Counters whose median per unit of work differs by more than `threshold`,
    or happened on one side only."""
    def per_unit(ss: list[Sample]) -> dict[str, float]:
        keys = {k for s in ss for k in s.vmstat_delta}
        return {k: float(np.median([s.vmstat_delta.get(k, 0) / work_units(s)[0] for s in ss]))
                for k in keys}
    a, b = per_unit(samples), per_unit(base)
    out = []
    for k in sorted(a.keys() | b.keys()):
        x, y = a.get(k, 0.0), b.get(k, 0.0)
        if (x > 0) != (y > 0) or (y and abs(x / y - 1) > threshold):
            out.append(VmstatChange(k, x, y))
    return out


def explain_pair(arm: str, baseline: str, data: dict, base_data: dict,
                 samples: list[Sample], base_samples: list[Sample], n: int = 12,
                 focus: str | None = None) -> PairExplanation:
    sa, sb = data.get("stacks"), base_data.get("stacks")
    deltas, ca, cb = [], float("nan"), float("nan")
    if sa and sb:
        fa, fb = _folded(data, focus), _folded(base_data, focus)
        deltas = stacks.diff(fa, sa["units"], fb, sb["units"], n)
        ca, cb = sum(fa.values()) / sa["units"], sum(fb.values()) / sb["units"]
    return PairExplanation(arm, baseline, (sa or {}).get("unit", "sample"), ca, cb, deltas,
                           vmstat_changes(samples, base_samples), event_changes(data, base_data))


@dataclass
class Explanation:
    arms: list[ArmExplanation]      # host arms with perf stacks, locks, events
    pairs: list[PairExplanation]    # each arm against its baseline, both attributed
    guests: list[GuestTrace]        # guest arms' in-guest traces

    def to_json(self) -> dict:
        return {"arms": [asdict(a) for a in self.arms], "pairs": [asdict(p) for p in self.pairs],
                "guest_traces": [asdict(g) for g in self.guests]}


def explain_experiment(plan: Plan, attributed: dict[str, dict], samples: dict[str, list[Sample]],
                       focus: str | None = None, n: int = 12) -> Explanation:
    """Every explanation the stored attribution of one experiment supports."""
    guests = [g for g in (guest_trace(a, d) for a, d in attributed.items()) if g]
    arms = [explain_arm(a, d, samples.get(a, []), n=n, focus=focus)
            for a, d in attributed.items() if "guest_trace" not in d]
    pairs = [explain_pair(p.arm.name, p.baseline.name, attributed[p.arm.name],
                          attributed[p.baseline.name], samples.get(p.arm.name, []),
                          samples.get(p.baseline.name, []), n=n, focus=focus)
             for p in verdicts.pairs(plan)
             if p.arm.name in attributed and p.baseline.name in attributed]
    return Explanation(arms, pairs, guests)


def _file(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", name)


def write_flamegraphs(out: Path, attributed: dict[str, dict], pairs: list,
                      focus: str | None = None) -> list[Path]:
    """One flame graph per arm with perf stacks, one differential per pair."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    suffix = f" (stacks through {focus})" if focus else ""
    for arm, data in attributed.items():
        folded = _folded(data, focus)
        if folded:
            path = out / f"flame-{_file(arm)}.svg"
            path.write_text(flamegraph.render(folded, f"{arm}: perf cpu-clock{suffix}"))
            written.append(path)
    for p in pairs:
        a, b = attributed.get(p.arm.name, {}), attributed.get(p.baseline.name, {})
        fa, fb = _folded(a, focus), _folded(b, focus)
        if fa and fb:
            path = out / f"diff-{_file(p.arm.name)}-vs-{_file(p.baseline.name)}.svg"
            path.write_text(flamegraph.differential(
                fa, a["stacks"]["units"], fb, b["stacks"]["units"],
                f"{p.arm.name} vs {p.baseline.name}{suffix}"))
            written.append(path)
    return written
