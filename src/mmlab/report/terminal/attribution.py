"""`mmlab explain` on the terminal: each arm's stacks, lock waits and
events, each pair's differences, kernel instructions by function, in-guest
traces, and what collecting them cost.  The data comes from
attribution/explain.py; only the tables are made here."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mmlab.attribution.explain import (
    ArmExplanation,
    Explanation,
    GuestExplanation,
    PairExplanation,
    WindowFunctions,
)
from mmlab.experiment.plan import Plan
from mmlab.report.fmt import (
    FUNCTIONS_LEGEND,
    beside_trials,
    call_path,
    contrast,
    num,
    pct,
    ratio,
    signed,
)
from mmlab.report.terminal import escaped
from mmlab.report.terminal.fit import Fitted


def arm_explanation(a: ArmExplanation) -> Fitted:
    table = Table(title=f"{escaped(a.arm)}: CPU time {num(a.cpu_ns_per_unit)} ns "
                        f"per {a.unit} (perf cpu-clock)")
    table.add_column("function")
    table.add_column("inclusive", justify="right")
    table.add_column("self", justify="right")
    for f in a.top:
        table.add_row(escape(f.function), pct(f.inclusive), pct(f.self_share))
    if a.callers:
        table.add_section()
        for c in a.callers:
            table.add_row(escape(f"lock wait: {c.caller}"), f"{num(c.wait_us)} us",
                          f"{c.seen} seen")
    if a.events:
        table.add_section()
        for e in a.events:
            table.add_row(f"event {e.event}", num(e.count), f"{num(e.per_unit)}/{a.unit}")
        if a.events_lost:
            table.add_row(f"[yellow]events lost to a full buffer: {a.events_lost}[/yellow]", "", "")
    return Fitted(table)


def pair_explanation(plan: Plan, p: PairExplanation) -> Fitted | str:
    """Where a pair's CPU time differs, and the vmstat counters and events
    that differ; a line, not an empty table, where nothing does."""
    label = contrast(plan, p.arm, p.baseline).label
    if not (p.deltas or p.vmstat or p.events):
        return escape(f"{label}: no perf stacks, and no vmstat counter or event differs")
    title = (f"{label}: CPU time per {p.unit} {num(p.cpu_ns_per_unit_baseline)} -> "
             f"{num(p.cpu_ns_per_unit)} ns ({signed(p.cpu_change)} ns); where the difference is"
             if p.deltas else f"{label}: vmstat counters that differ (no perf stacks)")
    table = Table(title=escape(title))
    for col in ("function", "baseline ns", "arm ns", "change ns", "share of change"):
        table.add_column(col, justify="left" if col == "function" else "right")
    for d in p.deltas:
        table.add_row(escape(d.function), num(d.cost_baseline), num(d.cost), signed(d.change),
                      pct(d.share_of_change))
    for kind, rows in (("vmstat", p.vmstat), ("event", p.events)):
        if rows:
            table.add_section()
        for v in rows:
            table.add_row(f"{kind} {v.counter} per {p.unit}", num(v.per_unit_baseline),
                          num(v.per_unit), "", "")
    return Fitted(table)


def overhead_table(arms: list[ArmExplanation]) -> Fitted | str:
    """Each attribution run's metrics over the clean median: what collection costs."""
    if not any(a.overhead for a in arms):
        return ""
    table = Table(title="attribution overhead: metric under collection / clean median")
    for col in ("arm", "collection", "metric", "ratio"):
        table.add_column(col, justify="right" if col == "ratio" else "left")
    for a in arms:
        for o in a.overhead:
            table.add_row(escaped(a.arm), o.collection, o.metric, ratio(o.ratio, "x"))
    return Fitted(table)


def functions_table(w: WindowFunctions) -> Fitted:
    """Kernel instructions per unit by function in one window: an arm's
    largest, or against its baseline, the largest changes."""
    per = f"/{w.unit}"
    if w.baseline is None:
        table = Table(title=f"{escaped(w.arm)}: kernel instructions in '{w.window}' "
                            f"by function ({num(w.kernel)} {per}, unresolved "
                            f"{num(w.unresolved)})")
        table.add_column("function")
        table.add_column(f"instructions {per}", justify="right")
        table.add_column("share", justify="right")
        for r in w.rows:
            table.add_row(r.label, num(r.per_unit), pct(r.per_unit / w.kernel))
        return Fitted(table)
    table = Table(title=f"{escaped(w.arm)} vs {escaped(w.baseline)}: "
                        f"kernel instructions in '{w.window}' {num(w.kernel_baseline)} -> "
                        f"{num(w.kernel)} {per} ({signed(w.change)})")
    for col in ("function", "baseline", "arm", "change"):
        table.add_column(f"{col} {per}" if col != "function" else col,
                         justify="left" if col == "function" else "right")
    for r in w.rows:
        table.add_row(r.label, num(r.per_unit_baseline), num(r.per_unit), signed(r.change))
    return Fitted(table)


def guest_trace_table(guests: list[GuestExplanation]) -> Fitted:
    """In-guest function counts and call times, side by side for every arm."""
    table = Table(title="in-guest trace per arm (instrumented trials; TCG times are emulated)")
    for col in ("arm", "figure", "function", "value", "per unit of work"):
        table.add_column(col, justify="right" if col in ("value", "per unit of work") else "left")
    for g in guests:
        for f in g.figures:
            table.add_row(escaped(g.arm), f.figure, f.function, num(f.value),
                          f"{num(f.per_unit)} /{g.unit}")
        if g.skipped:
            table.add_row(escaped(g.arm), "skipped", ", ".join(g.skipped), "", "")
        table.add_section()
    return Fitted(table)


def print_explanation(out: Console, plan: Plan, found: Explanation) -> None:
    """`mmlab explain`: guest traces, instructions by function, each arm's
    stacks, the attribution overhead, and each pair's differences."""
    if found.guests:
        out.print(guest_trace_table(found.guests))
    if found.functions:
        out.print(escape(FUNCTIONS_LEGEND))
    for w in found.functions:
        out.print(functions_table(w))
        if said := beside_trials(w):
            out.print(escape(said))
        for path in w.paths:
            out.print(escape(call_path(path, w.unit)))
    for a in found.arms:
        out.print(arm_explanation(a))
    out.print(overhead_table(found.arms))
    for p in found.pairs:
        out.print(pair_explanation(plan, p))
