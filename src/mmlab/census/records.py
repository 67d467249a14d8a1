"""The census's records: what it reports, typed, for tables and --json.

A group is every VMA whose anon_vma has one root (vma->anon_vma->root).  A
KSM page's rmap walk (rmap_walk_ksm) visits the interval tree of one
anon_vma, and a root's tree holds an entry for every VMA of the group: the
group's size is the walk's length for a page of the root anon_vma, the
figure seed 004's benchmark sets with --vmas.  Ids are ranks (1: the
census's largest group), never kernel addresses.
"""

from __future__ import annotations

from pydantic import BaseModel


class Pattern(BaseModel):
    """What the group's VMAs look like in /proc/PID/smaps, and why each pair
    of neighbours is two VMAs rather than one: "protection" (mprotect),
    "flags: lo" (VmFlags differ: mlock, madvise), "gap" (not adjacent),
    "offset" (adjacent, same flags, but their pages are not contiguous in
    the anon_vma's offsets: mremap moved one) or "other" (a name, userfaultfd,
    a NUMA policy: what smaps does not show)."""
    protections: dict[str, int] = {}
    flags: dict[str, int] = {}
    boundaries: dict[str, int] = {}

    def summary(self, most: int = 3) -> str:
        """One line: the commonest protections and boundary reasons."""
        def top(d: dict[str, int]) -> str:
            return ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:most])
        return "; ".join(part for part in (top(self.protections), top(self.boundaries)) if part)


class Group(BaseModel):
    """One root anon_vma's VMAs in one process."""
    id: int
    vmas: int                 # this process's VMAs in the group
    anon_vmas: int            # the distinct anon_vmas they hang off
    largest_anon_vma: int     # most of them on one anon_vma
    vmas_all: int             # in every process of the census (forks share a root)
    processes: int
    pattern: Pattern | None = None


class ProcessCensus(BaseModel):
    pid: int
    comm: str
    vmas: int
    anon_vmas: int
    largest_group: int
    largest_anon_vma: int
    groups: list[Group]       # largest first, as many as asked for


class Census(BaseModel):
    """One pass over the processes asked for, largest group first."""
    kernel: str
    seconds: float            # the iterator, the grouping and the smaps reads
    vmas: int
    largest_group: int        # over processes: a root's VMAs in every process
    processes: list[ProcessCensus]
    shown: int                # processes with a table (the rest are in `processes` only)


class Moment(BaseModel):
    """A command's process tree at one moment while it ran; largest_group
    counts a root's VMAs over all the tree's processes.  ksm_pages_sharing:
    the machine's KSM pages_sharing then (in a guest, the command's alone),
    None when ksmd was not running."""
    at_s: float
    processes: int
    vmas: int
    largest_group: int
    ksm_pages_sharing: int | None = None


class CommandCensus(BaseModel):
    """A command's moments while it ran; `peak` is the census of the
    first moment whose largest group (over its processes) was largest.  `output`:
    the last lines it printed (a program's own figures, such as how much
    work it did: a guest's emulated CPU does far less in the same time)."""
    command: list[str]
    exit_code: int
    seconds: float
    output: str = ""
    moments: list[Moment]
    peak_at_s: float
    peak: Census
