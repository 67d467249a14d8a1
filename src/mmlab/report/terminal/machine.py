"""What mmlab and this machine offer, on the terminal: the workloads with
their parameters and metrics (`mmlab workloads`), and the probe's facts
(`mmlab probe`)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from mmlab.report.fmt import arrow
from mmlab.workloads import HARNESS_PARAMS, Workload


def workloads_table(workloads: list[Workload]) -> Table:
    """Every workload with its parameters, metrics and mm paths; metric names
    never wrap or shorten, so they can be copied into a profile."""
    table = Table(title="mmlab workloads", show_lines=True)
    for col in ("workload", "seed", "parameters (default)"):
        table.add_column(col, overflow="fold")
    table.add_column("metrics", no_wrap=True, overflow="ignore")
    table.add_column("mm paths", overflow="fold")
    for w in workloads:
        params = "\n".join(f"--{p.name} ({p.default})" for p in w.params
                           if p.name not in HARNESS_PARAMS)
        metrics = "\n".join(f"{m.name} {arrow(m)}" for m in w.metrics)
        table.add_row(f"[bold]{w.name}[/bold]\n{w.summary}", w.seed, params, metrics,
                      "\n".join(w.mm_paths))
    return table


def probe_table(facts: list) -> Table:
    """`mmlab probe`'s facts (ok, what, value, note), as measured: the table
    renders them without importing the targets that measured them."""
    table = Table(title="mmlab probe: this machine, measured now")
    table.add_column("")
    table.add_column("what")
    table.add_column("measured")
    table.add_column("what follows")
    for f in facts:
        table.add_row("[green]ok[/green]" if f.ok else "[yellow]--[/yellow]", f.what,
                      escape(f.value), escape(f.note))
    return table
