"""Every VMA of every process as the kernel holds it, with its anon_vma and
that anon_vma's root.

/proc/PID/maps cannot tell which VMAs share an anon_vma: two pieces of one
split mapping and two unrelated mappings look alike there.  So the census
reads the kernel's own structures with a BPF task_vma iterator
(workloads/census/census.bpf.c, loaded by the static `mmcensus`): a BPF
program the kernel runs once per VMA under that process's mmap lock, which
reads vma->anon_vma and vma->anon_vma->root.  It needs the kernel's BTF
(/sys/kernel/btf/vmlinux) and root; without either, one line says so and
nothing is guessed.
"""

from __future__ import annotations

from typing import NamedTuple

from mmlab.errors import MmlabError
from mmlab.machine import proc
from mmlab.workloads.build import built


class Vma(NamedTuple):
    """One VMA.  A NamedTuple, not a pydantic model: a census reads tens of
    thousands of them and keeps none; the records it reports are models.
    anon_vma and root are kernel addresses, used as identities only."""
    tgid: int
    ppid: int
    start: int
    end: int
    flags: int
    pgoff: int
    file: bool
    anon_vma: int
    root: int
    comm: str


def read() -> list[Vma]:
    """Every process's VMAs (one thread per process: the iterator skips the
    threads that share their leader's files, and a second view of one mm is
    dropped here)."""
    done = proc.call([built("mmcensus")], what="mmcensus", check=False, timeout=60)
    if done.returncode:
        raise MmlabError(f"census: {proc.last_words(done, 1).removeprefix('mmcensus: ')}")
    return parse(done.stdout)


def parse(text: str) -> list[Vma]:
    """mmcensus's lines (tgid tid ppid start end flags pgoff file anon_vma
    root comm; numbers after the ids in hex) as Vma records, each mm once."""
    out = []
    first_tid: dict[int, int] = {}
    for line in text.splitlines():
        tgid, tid, ppid, start, end, flags, pgoff, file, anon, root, *comm = line.split(" ")
        tgid_i, tid_i = int(tgid), int(tid)
        if first_tid.setdefault(tgid_i, tid_i) != tid_i:
            continue
        out.append(Vma(tgid_i, int(ppid), int(start, 16), int(end, 16), int(flags, 16),
                       int(pgoff, 16), file == "1", int(anon, 16), int(root, 16), " ".join(comm)))
    return out
