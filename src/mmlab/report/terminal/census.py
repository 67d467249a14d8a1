"""The census on the terminal, as a person reads it: a line of totals, a
table of the processes, and a table of groups per process shown."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from mmlab.census.records import Census, CommandCensus, ProcessCensus
from mmlab.report.fmt import num
from mmlab.report.terminal.fit import Fitted


def print_census(out: Console, census: Census) -> None:
    out.print(f"census of {len(census.processes):,} processes, {census.vmas:,} VMAs on "
              f"{census.kernel}, taken in {census.seconds * 1000:.0f} ms (BPF task_vma "
              "iterator: vma->anon_vma and its root as the kernel holds them); largest group "
              f"{census.largest_group:,} VMAs over all processes")
    if len(census.processes) > 1:
        out.print(processes_table(census))
    for p in census.processes[:census.shown]:
        out.print(groups_table(p))


def print_command(out: Console, found: CommandCensus) -> None:
    peak = max((s.largest_group for s in found.moments), default=0)
    out.print(f"{' '.join(found.command)}: exit {found.exit_code} after "
              f"{found.seconds:.1f} s, {len(found.moments)} moments; largest group "
              f"{peak:,} VMAs over its processes, first reached {found.peak_at_s:.1f} s in")
    shared = [s.ksm_pages_sharing for s in found.moments if s.ksm_pages_sharing is not None]
    if shared:
        out.print(f"ksmd ran: up to {max(shared):,} pages shared (KSM's pages_sharing, "
                  f"in {len(shared)} of {len(found.moments)} moments)")
    if found.output:
        out.print(f"it printed last: {found.output}", markup=False)
    out.print("the census at that moment:")
    print_census(out, found.peak)


def processes_table(census: Census) -> Fitted:
    table = Table(title="processes, largest group first")
    for col in ("PID", "command", "VMAs", "anon_vmas", "largest group", "largest anon_vma",
                "pattern of the largest group"):
        table.add_column(col, justify="left" if col in ("command", "pattern of the largest group")
                         else "right")
    for p in census.processes[:census.shown]:
        pattern = p.groups[0].pattern if p.groups else None
        table.add_row(str(p.pid), p.comm, num(p.vmas), num(p.anon_vmas), num(p.largest_group),
                      num(p.largest_anon_vma), pattern.summary() if pattern else "")
    if len(census.processes) > census.shown:
        most = census.processes[census.shown].largest_group
        table.caption = (f"and {len(census.processes) - census.shown:,} more, each with a "
                         f"largest group of at most {most:,}")
    return Fitted(table, key=2)


def groups_table(p: ProcessCensus) -> Fitted:
    table = Table(title=f"{p.pid} {p.comm}: {p.vmas:,} VMAs, {p.anon_vmas:,} anon_vmas; "
                        "VMAs per root anon_vma, largest first")
    for col in ("group", "VMAs", "anon_vmas", "largest anon_vma", "in all processes",
                "processes", "protections", "why neighbours are apart", "VmFlags"):
        table.add_column(col, justify="right" if col not in (
            "protections", "why neighbours are apart", "VmFlags") else "left")
    for g in p.groups:
        pat = g.pattern
        table.add_row(f"#{g.id}", num(g.vmas), num(g.anon_vmas), num(g.largest_anon_vma),
                      num(g.vmas_all), num(g.processes),
                      _counts(pat.protections) if pat else "", _counts(pat.boundaries) if pat
                      else "", _counts(pat.flags) if pat else "")
    return Fitted(table)


def _counts(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(d.items(), key=lambda kv: -kv[1]))
