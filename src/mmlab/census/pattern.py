"""The pattern that built a group: its VMAs' protections and VmFlags as
/proc/PID/smaps shows them, and why neighbouring VMAs did not merge.

Two adjacent VMAs of one anon_vma merge unless something differs, so the
difference between neighbours names the call that split them: mprotect
(protections), mlock or madvise (VmFlags), munmap or a separate mmap (a gap),
mremap (page offsets no longer contiguous).  smaps is read outside any timed
window; it walks page tables and is slow on a big process, so only the
groups shown are read.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from mmlab.census.iterator import Vma
from mmlab.census.records import Pattern

PAGE = 4096
# VmFlags every anonymous VMA shows, or that repeat the protections: noise.
COMMON = {"rd", "wr", "ex", "sh", "mr", "mw", "me", "ms", "ac", "sd", "gd", "um", "uw"}


def smaps_flags(pid: int) -> dict[int, tuple[str, frozenset[str]]]:
    """{start: (perms, VmFlags)} of every VMA in /proc/PID/smaps.  Raises
    FileNotFoundError/ProcessLookupError when the process is gone."""
    out: dict[int, tuple[str, frozenset[str]]] = {}
    start, perms = 0, ""
    with open(Path("/proc", str(pid), "smaps")) as f:
        for line in f:
            if line.startswith("VmFlags:"):
                out[start] = (perms, frozenset(line.split()[1:]))
            elif "-" in line.split(" ", 1)[0] and not line[0].isupper():
                addr, perms = line.split(" ", 2)[:2]
                start = int(addr.split("-")[0], 16)
    return out


def of(group: list[Vma], smaps: dict[int, tuple[str, frozenset[str]]]) -> Pattern:
    """The pattern of `group` (one process's VMAs of one root)."""
    vmas = sorted(group, key=lambda v: v.start)
    seen = [smaps.get(v.start, ("?", frozenset())) for v in vmas]
    flags = Counter(f for _, fl in seen for f in fl - COMMON)
    boundaries = Counter(_why_apart(a, b, sa, sb)
                         for a, b, sa, sb in zip(vmas, vmas[1:], seen, seen[1:]))
    return Pattern(protections=dict(Counter(p for p, _ in seen)), flags=dict(flags),
                   boundaries=dict(boundaries))


def _why_apart(a: Vma, b: Vma, sa: tuple[str, frozenset[str]],
               sb: tuple[str, frozenset[str]]) -> str:
    if a.end != b.start:
        return "gap"
    if sa[0] != sb[0]:
        return "protection"
    if sa[1] != sb[1]:
        return "flags: " + " ".join(sorted(sa[1] ^ sb[1]))
    if a.pgoff + (a.end - a.start) // PAGE != b.pgoff:
        return "offset"
    return "other"
