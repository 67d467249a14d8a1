"""One census: the iterator's pass, grouped, with the patterns of the groups
shown; of given PIDs, of a command's process tree, or of every process."""

from __future__ import annotations

import platform
import time
from pathlib import Path

from mmlab.census import groups, iterator, pattern
from mmlab.census.iterator import Vma
from mmlab.census.records import Census, ProcessCensus
from mmlab.errors import MmlabError


def take(pids: list[int] | None = None, top: int = 5) -> Census:
    """The census of `pids` (None: every process), each with its `top`
    groups; tables for the `top` processes with the largest groups.  A PID
    that does not exist, or exits before its smaps is read, is an error
    naming it."""
    wanted = set(pids or ())
    for pid in sorted(wanted):
        _check_process(pid)
    t0 = time.perf_counter()
    everyone = iterator.read()
    found = of(everyone, wanted or None, top, t0)
    missing = wanted - {p.pid for p in found.processes}
    found.processes += [_without_vmas(pid) for pid in sorted(missing)]
    return found


def of(everyone: list[Vma], pids: set[int] | None, top: int, t0: float,
       strict: bool = True, patterns: bool = True) -> Census:
    """The census of `pids` (None: all) among the VMAs of `everyone`, timed
    from `t0`.  strict: a process asked for by PID that is gone before its
    pattern is read is an error; otherwise it goes without a pattern.
    patterns=False: none read (VMAs from a guest, whose smaps is not here)."""
    vmas = everyone if pids is None else [v for v in everyone if v.tgid in pids]
    ids = groups.root_ids(everyone)
    roots = {rank: root for root, rank in ids.items()}
    procs = groups.processes(vmas, everyone, ids, top)
    sizes = groups.root_sizes(everyone)
    mine = groups.by_process(vmas)
    for p in procs[:top] if patterns else ():
        if p.groups and p.groups[0].vmas > 1:
            members = groups.members(mine[p.pid], roots[p.groups[0].id])
            p.groups[0].pattern = _pattern(p.pid, members, strict and pids is not None)
    return Census(kernel=platform.release(), seconds=time.perf_counter() - t0, vmas=len(vmas),
                  largest_group=max((sizes[v.root] for v in vmas if v.root), default=0),
                  processes=procs, shown=min(top, len(procs)))


def _pattern(pid: int, members: list[Vma], strict: bool):
    try:
        return pattern.of(members, pattern.smaps_flags(pid))
    except (FileNotFoundError, ProcessLookupError) as exc:
        if strict:
            raise MmlabError(f"PID {pid} exited during the census") from exc
        return None


def _check_process(pid: int) -> None:
    """A PID the census can name: a process (thread group leader) now."""
    try:
        status = Path("/proc", str(pid), "status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        raise MmlabError(f"PID {pid}: no such process") from None
    tgid = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("Tgid:")))
    if tgid != pid:
        raise MmlabError(f"PID {pid} is a thread of process {tgid}: census {tgid}")


def _without_vmas(pid: int) -> ProcessCensus:
    """A PID asked for that the iterator did not show: a kernel thread (no
    address space), or an error if it is gone or not one."""
    try:
        comm = Path("/proc", str(pid), "comm").read_text().strip()
        has_mm = "VmSize:" in Path("/proc", str(pid), "status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        raise MmlabError(f"PID {pid} exited during the census") from None
    if has_mm:
        raise MmlabError(f"PID {pid} ({comm}): the iterator did not show its VMAs "
                         "(it exited and its PID was reused, or its leader thread is gone)")
    return ProcessCensus(pid=pid, comm=comm, vmas=0, anon_vmas=0, largest_group=0,
                         largest_anon_vma=0, groups=[])
