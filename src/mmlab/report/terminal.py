"""Rich tables for the terminal."""

from __future__ import annotations

import math
import time

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..probe import Fact
from ..samples import Sample
from ..stats import Comparison, summarize
from ..workloads import HARNESS_PARAMS, Workload


def fmt(value: float | None, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if float(value).is_integer():
        return f"{int(value):,}"
    mag = abs(value)
    if mag >= 1e5:
        return f"{value:,.0f}"
    if mag >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    return f"{value:.{max(0, digits - 1 - int(math.floor(math.log10(mag))))}f}"


def pct(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value * 100:.1f}%"


def samples_table(workload: Workload, samples: list[Sample]) -> Table:
    """One row per metric: each sample, then the median and the CV."""
    names = [m.name for m in workload.metrics if any(m.name in s.metrics for s in samples)]
    table = Table(title=f"{workload.name}: {len(samples)} samples")
    table.add_column("metric", no_wrap=True)
    for i in range(len(samples)):
        table.add_column(str(i + 1), justify="right")
    table.add_column("median", justify="right", style="bold")
    table.add_column("CV", justify="right")
    for name in names:
        arrow = "↑" if workload.metric(name).higher_is_better else "↓"
        summary = summarize([s.metrics.get(name) for s in samples])
        table.add_row(f"{name} {arrow}", *(fmt(s.metrics.get(name)) for s in samples),
                      fmt(summary.median), pct(summary.cv))
    return table


def state_table(samples: list[Sample]) -> Table:
    """The page state the samples ran in; differing values are all listed."""
    table = Table(title="page state (measured)", show_header=True)
    table.add_column("state")
    table.add_column("value(s)")
    for key in samples[0].state:
        values = []
        for s in samples:
            v = s.state.get(key)
            text = fmt(v) if isinstance(v, float | int) else str(v)
            if text not in values:
                values.append(text)
        table.add_row(key, escape(", ".join(values)), style="yellow" if len(values) > 1 else None)
    return table


def vmstat_table(samples: list[Sample]) -> Table:
    table = Table(title="/proc/vmstat deltas per sample (median) and errors")
    table.add_column("counter")
    table.add_column("median", justify="right")
    for key in samples[0].vmstat_delta:
        table.add_row(key, fmt(summarize([s.vmstat_delta.get(key, 0) for s in samples]).median))
    errors: dict[str, float] = {}
    for s in samples:
        for k, v in s.errors.items():
            errors[k] = errors.get(k, 0) + v
    for k, v in errors.items():
        table.add_row(f"[red]error {k}[/red]", fmt(v))
    return table


def workloads_table(workloads: list[Workload]) -> Table:
    table = Table(title="mmlab workloads", show_lines=True)
    for col in ("workload", "seed", "parameters (default)", "metrics", "mm paths"):
        table.add_column(col)
    for w in workloads:
        params = "\n".join(f"--{p.name} ({p.default})" for p in w.params
                           if p.name not in HARNESS_PARAMS)
        metrics = "\n".join(f"{m.name} {'↑' if m.higher_is_better else '↓'}" for m in w.metrics)
        table.add_row(f"[bold]{w.name}[/bold]\n{w.summary}", w.seed, params, metrics,
                      "\n".join(w.mm_paths))
    return table


def probe_table(facts: list[Fact]) -> Table:
    table = Table(title="mmlab probe: this machine, measured now")
    table.add_column("")
    table.add_column("what")
    table.add_column("measured")
    table.add_column("what follows")
    for f in facts:
        table.add_row("[green]ok[/green]" if f.ok else "[yellow]--[/yellow]", f.what,
                      escape(f.value), escape(f.note))
    return table


def console() -> Console:
    """Stdout; when it is not a terminal (logs, CI), wide enough for the tables."""
    import os
    import sys
    width = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 140
    return Console(highlight=False, width=width)


VERDICT_STYLE = {"regression": "bold red", "improvement": "bold green", "no change": "cyan",
                 "unreliable": "yellow", "not comparable": "magenta"}


def pair_label(arm: str, baseline: str) -> str:
    """'swap=zram:64M,thp=hugepage' vs 'swap=none,thp=hugepage' ->
    'thp=hugepage: swap zram:64M vs none'; other names are kept whole."""
    a, b = arm.split(","), baseline.split(",")
    if not all("=" in x for x in a + b) or len(a) != len(b):
        return f"{arm} vs {baseline}"
    shared = [x for x in a if x in b]
    differ = [f"{x.split('=', 1)[0]} {x.split('=', 1)[1]} vs {y.split('=', 1)[1]}"
              for x, y in zip(a, b) if x != y]
    return (",".join(shared) + ": " if shared else "") + "; ".join(differ)


def compare_table(title: str, comparisons: list[Comparison]) -> Table:
    """Mailing-list layout: medians side by side, the change, the ratio and its CI."""
    table = Table(title=title)
    width = max([len(c.metric) for c in comparisons] + [6])
    table.add_column("metric", no_wrap=True, min_width=width)
    table.add_column("arm vs baseline", overflow="fold", min_width=26)
    for col in ("baseline", "arm", "change", "ratio", "95% CI", "p"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    for c in comparisons:
        ci = "-" if not math.isfinite(c.ci_low) else f"{c.ci_low:.3f}..{c.ci_high:.3f}"
        p = "-" if not math.isfinite(c.p_value) else f"{c.p_value:.2g}"
        ratio = "-" if not math.isfinite(c.ratio) else f"{c.ratio:.3f}x"
        change = "-" if not math.isfinite(c.ratio) else f"{c.change:+.1%}"
        table.add_row(c.metric, escape(pair_label(c.arm, c.baseline)), fmt(c.median_baseline),
                      fmt(c.median), change, ratio, ci, p,
                      f"[{VERDICT_STYLE[c.verdict]}]{c.verdict}[/]")
    return table


def reasons(comparisons: list[Comparison]) -> list[str]:
    """One line per distinct reason behind a verdict other than a clear one."""
    seen, out = set(), []
    for c in comparisons:
        key = (c.arm, c.baseline, c.reason)
        if key not in seen:
            seen.add(key)
            out.append(f"{c.arm} vs {c.baseline}: {c.verdict}: {c.reason}")
    return out


def arm_summary_table(workload: Workload, samples: dict[str, list[Sample]],
                      metrics: list[str]) -> Table:
    table = Table(title="per arm: median (CV), n")
    table.add_column("arm")
    table.add_column("n", justify="right")
    for m in metrics:
        arrow = "↑" if workload.metric(m).higher_is_better else "↓"
        table.add_column(f"{m} {arrow}", justify="right")
    for arm, ss in samples.items():
        cells = []
        for m in metrics:
            s = summarize([x.metrics.get(m) for x in ss])
            cells.append(f"{fmt(s.median)} ({pct(s.cv)})")
        table.add_row(escape(arm), str(len(ss)), *cells)
    return table


def experiments_table(rows) -> Table:
    table = Table(title="experiments")
    for col in ("ID", "name", "workload", "created", "trials", "done", "failed"):
        table.add_column(col)
    for r in rows:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"]))
        table.add_row(str(r["id"]), r["name"], r["workload"], created, str(r["trials"]),
                      str(r["done"]), str(r["failed"]))
    return table


def kernels_table(cached) -> Table:
    table = Table(title="cached kernels")
    for col in ("name", "version", "source", "config sha256", "features (m: module, -: absent)"):
        table.add_column(col, overflow="fold")
    for k in cached:
        feats = " ".join(f if v == "y" else f"{f}(m)" if v == "m" else f"-{f}"
                         for f, v in k.features().items())
        table.add_row(k.name, k.version, escape(k.source), k.config_sha256[:12], feats)
    return table


def accelerator_notes(samples: dict[str, list[Sample]]) -> list[str]:
    """Say plainly which arms ran emulated, once per accelerator."""
    by_accel: dict[str, list[str]] = {}
    for arm, ss in samples.items():
        for accel in {str(s.state.get("accelerator", "none (host)")) for s in ss}:
            by_accel.setdefault(accel, []).append(arm)
    notes = []
    for accel, arms in by_accel.items():
        if accel == "tcg":
            notes.append(f"[yellow]accelerator: TCG for {len(arms)} arm(s): timings are emulated "
                         "and comparable only with other TCG timings[/yellow]")
        elif accel == "kvm":
            notes.append(f"accelerator: KVM for {len(arms)} arm(s)")
    return notes


def trace_table(traced: dict[str, float]) -> Table:
    """In-guest trace figures for the whole traced trial (warm-ups included)."""
    table = Table(title="in-guest trace (whole trial, instrumented: not for timing)")
    table.add_column("figure")
    table.add_column("function")
    table.add_column("value", justify="right")
    for key, value in traced.items():
        what, _, func = key.partition(".")
        table.add_row(what.removeprefix("trace_"), func, fmt(value))
    return table


def arm_explanation(a) -> Table:
    table = Table(title=f"{escape(a.arm)}: CPU time {fmt(a.cpu_ns_per_unit)} ns per {a.unit} "
                        "(perf cpu-clock)")
    table.add_column("function")
    table.add_column("inclusive", justify="right")
    table.add_column("self", justify="right")
    for f in a.top:
        table.add_row(escape(f.function), pct(f.inclusive), pct(f.self_share))
    if a.callers:
        table.add_section()
        for caller, n, us in a.callers:
            table.add_row(escape(f"lock wait: {caller}"), f"{fmt(us)} us", f"{n} seen")
    if a.events:
        table.add_section()
        for name, n, per in a.events:
            table.add_row(f"event {name}", fmt(n), f"{fmt(per)}/{a.unit}")
        if a.events_lost:
            table.add_row(f"[yellow]events lost to a full buffer: {a.events_lost}[/yellow]", "", "")
    return table


def pair_explanation(p) -> Table:
    change = p.cpu_ns_per_unit - p.cpu_ns_per_unit_baseline
    title = (f"{pair_label(p.arm, p.baseline)}: CPU time per {p.unit} "
             f"{fmt(p.cpu_ns_per_unit_baseline)} -> {fmt(p.cpu_ns_per_unit)} ns "
             f"({change:+.4g} ns); where the difference is" if p.deltas else
             f"{pair_label(p.arm, p.baseline)}: vmstat counters that differ (no perf stacks)")
    table = Table(title=escape(title))
    for col in ("function", "baseline ns", "arm ns", "change ns", "share of change"):
        table.add_column(col, justify="left" if col == "function" else "right")
    for d in p.deltas:
        table.add_row(escape(d.function), fmt(d.cost_baseline), fmt(d.cost), f"{d.change:+.4g}",
                      pct(d.share_of_change))
    for kind, rows in (("vmstat", p.vmstat), ("event", p.events)):
        if rows:
            table.add_section()
        for v in rows:
            table.add_row(f"{kind} {v.counter} per {p.unit}", fmt(v.per_unit_baseline),
                          fmt(v.per_unit), "", "")
    return table


def overhead_table(arms) -> Table | str:
    """Each attribution run's metrics over the clean median: what collection costs."""
    if not any(a.overhead for a in arms):
        return ""
    table = Table(title="attribution overhead: metric under collection / clean median")
    for col in ("arm", "collection", "metric", "ratio"):
        table.add_column(col, justify="right" if col == "ratio" else "left")
    for a in arms:
        for o in a.overhead:
            table.add_row(escape(a.arm), o.collection, o.metric, f"{o.ratio:.3f}x")
    return table


def guest_trace_table(guests) -> Table:
    """In-guest function counts and call times, side by side for every arm."""
    table = Table(title="in-guest trace per arm (instrumented trials; TCG times are emulated)")
    for col in ("arm", "figure", "function", "value", "per unit of work"):
        table.add_column(col, justify="right" if col in ("value", "per unit of work") else "left")
    for g in guests:
        for figure, func, value, per_unit in g.rows:
            table.add_row(escape(g.arm), figure, func, fmt(value), f"{fmt(per_unit)} /{g.unit}")
        if g.skipped:
            table.add_row(escape(g.arm), "skipped", ", ".join(g.skipped), "", "")
        table.add_section()
    return table
