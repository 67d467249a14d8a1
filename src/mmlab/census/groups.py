"""VMAs counted by anon_vma and by root anon_vma, per process, largest first.

A root's group spans processes when they forked from one another (a child's
anon_vmas hang off its parent's root), so each group also carries its size
over every process on the machine, whichever processes were asked for.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from mmlab.census.iterator import Vma
from mmlab.census.records import Group, ProcessCensus


def by_process(vmas: list[Vma]) -> dict[int, list[Vma]]:
    out: dict[int, list[Vma]] = defaultdict(list)
    for v in vmas:
        out[v.tgid].append(v)
    return out


def root_sizes(vmas: list[Vma]) -> Counter:
    """{root address: VMAs in its group}."""
    return Counter(v.root for v in vmas if v.root)


def root_ids(vmas: list[Vma]) -> dict[int, int]:
    """{root address: rank}, 1 for the root with the most VMAs."""
    return {root: rank for rank, (root, _) in enumerate(root_sizes(vmas).most_common(), 1)}


def processes(vmas: list[Vma], everyone: list[Vma], ids: dict[int, int],
              top: int) -> list[ProcessCensus]:
    """Every process in `vmas`, largest group first, each with its `top`
    groups; each group's size over all processes from `everyone` (every
    process the iterator saw), `ids` from root_ids(everyone)."""
    all_sizes = root_sizes(everyone)
    spread = Counter(root for root, _ in {(v.root, v.tgid) for v in everyone if v.root})
    out = [one(pid, mine, ids, all_sizes, spread, top) for pid, mine in by_process(vmas).items()]
    return sorted(out, key=lambda p: (-p.largest_group, -p.vmas, p.pid))


def one(pid: int, vmas: list[Vma], ids: dict[int, int], all_sizes: Counter,
        spread: Counter, top: int) -> ProcessCensus:
    per_anon = Counter(v.anon_vma for v in vmas if v.anon_vma)
    per_root = Counter(v.root for v in vmas if v.root)
    anons_of: dict[int, set[int]] = defaultdict(set)
    for v in vmas:
        if v.root:
            anons_of[v.root].add(v.anon_vma)
    largest = sorted(per_root, key=lambda r: (-per_root[r], -all_sizes[r]))[:top]
    groups = [Group(id=ids[root], vmas=per_root[root], anon_vmas=len(anons_of[root]),
                    largest_anon_vma=max(per_anon[a] for a in anons_of[root]),
                    vmas_all=all_sizes[root], processes=spread[root])
              for root in largest]
    return ProcessCensus(pid=pid, comm=vmas[0].comm, vmas=len(vmas), anon_vmas=len(per_anon),
                         largest_group=max(per_root.values(), default=0),
                         largest_anon_vma=max(per_anon.values(), default=0), groups=groups)


def members(vmas: list[Vma], root: int) -> list[Vma]:
    """The VMAs of `vmas` (one process's) whose anon_vma has this root."""
    return [v for v in vmas if v.root == root]
