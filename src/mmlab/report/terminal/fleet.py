"""The fleet on the terminal: the machines' status, and where a change
reproduced (fleet/summary.py gathers both)."""

from __future__ import annotations

import time

from rich.markup import escape
from rich.table import Table

from mmlab.fleet.summary import FleetSummary, MachineStatus, Reproduction
from mmlab.report.fmt import ratio, verdict_label
from mmlab.report.terminal.fit import Fitted


def status_table(rows: list[MachineStatus]) -> Fitted:
    table = Table(title="fleet: machines, queues, trials in flight")
    for col in ("machine", "worker", "queued", "planned", "running now", "machine class",
                "registered"):
        table.add_column(col)
    for r in rows:
        running = "; ".join(f"exp {e} trial {t.position} {escape(t.arm)} ({ago(t.started)})"
                            for e, t in r.running) or "-"
        table.add_row(escape(r.machine.name),
                      f"{escape(r.machine.node)} " + ("answers" if r.answering else
                                                       "[red]does not answer[/red]"),
                      "?" if r.queued is None else str(r.queued), str(r.planned), running,
                      escape(r.machine.describe()), ago(r.machine.registered))
    return Fitted(table)


def ago(t: float | None) -> str:
    return "-" if t is None else f"{time.time() - t:.0f} s ago"


def sentence(r: Reproduction) -> str:
    """'regression on a (1.520x), b (1.490x); no change on c (1.010x)', and
    'regression, emulated on d (1.300x)' where d's figures are emulated time."""
    groups: dict[str, list[str]] = {}
    for m, c in r.by_machine.items():
        groups.setdefault(verdict_label(c, m in r.emulated), []).append(
            f"{m} ({ratio(c.ratio, 'x')})")
    return "; ".join(f"{v} on {', '.join(ms)}" for v, ms in groups.items())


def summary_table(s: FleetSummary) -> Fitted:
    """One row per metric and pair: each machine's verdict and ratio, and
    where the change reproduced."""
    table = Table(title=f"fleet {s.fleet or '-'}: where the change reproduced (each verdict "
                        "from its own machine's trials)")
    table.add_column("metric", no_wrap=True)
    table.add_column("arm vs baseline")
    table.add_column("per machine: verdict (ratio)")
    table.add_column("reproduced on")
    for r in s.rows:
        table.add_row(r.metric, escape(f"{r.arm} vs {r.baseline}"), escape(sentence(r)),
                      f"{len(r.reproduced_on)} of {len(r.by_machine)}"
                      + (f": {escape(', '.join(r.reproduced_on))}" if r.reproduced_on else ""))
    return Fitted(table, key=2)


def machines_lines(s: FleetSummary) -> list[str]:
    return [escape(f"{m}: experiment {e}, {s.classes[m]}") for m, e in s.experiments.items()]
