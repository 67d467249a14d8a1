"""Same-state audit: did two arms really run in the same page state?

A timing difference means something only if the memory was in the state the
profile asked for.  Seed 001's headline ratio was undone because the two
kernels had not given the mapping the same THP backing; this module looks
for exactly that.  Each check reads measured state from the samples and
names the axes that are *allowed* to change it: if two arms differ in that
state while none of those axes differ between them, the pair is not
comparable.  An arm whose own samples disagree (some THP-backed, some not)
is flagged too.

Only an axis that asks for a page state may explain a difference in it:
thp and thp_mode for THP backing, swap for swap use, vmas and pattern for
VMA counts.  The axis under test (kernel, cpus, memory) never does: seed
001's 6.19 backed the same mapping with THPs where 6.12 did not, and that
is a different experiment, not a slower kernel.  Such a pair keeps its
ratio, but as a different-state comparison.

Large folios smaller than a PMD (multi-size THP, 6.8+) back anonymous memory
where AnonHugePages shows nothing, so each size's mode and its allocation,
fallback, split and swap-out counters are compared like PMD THP, by the same
axes.  A kernel without mTHP says "not available": it cannot have had such
folios, so that compares as "none happened", and is shown as what it is.

The kernel's own mm actors (DAMON, khugepaged, ksmd, proactive compaction)
change page state on their own while a workload runs; only an axis that sets
that very actor (ksm.run, sysctl.vm.compaction_proactiveness) explains a
difference in them.

A guest's memory changes kernel defaults the arm's settings may not touch:
below 512 MiB of RAM the kernel boots with THP off (all its flags cleared:
enabled and defrag never, no huge zero page), and min_free_kbytes scales
with memory (and rises when khugepaged starts).  A guest's THP mode as it
booted (before the arm's settings) is page state like the mode in force, and
a finding or note that meets the small-system rule says so in words.

Some readings are the trial's own (the smaps and pagemap of its mapping, its
process tree's rusage); others are the whole machine's (/proc/vmstat event
counters, the mTHP counters in sysfs, swap in use).  On a machine that runs
other work, the machine's counters hold the neighbours' events too: a QEMU
guest beside an A/A faults in THPs in one arm's trials and not the other's.
Each sample says how much of the machine's CPU went to others while it ran
(`neighbour_cpu_share`, mmwork).  Where a neighbour was there, a
machine-wide difference is named (a Finding `beside` a neighbour) but does
not make the pair incomparable: the trial's own readings still decide.

A restored guest starts from one of its kernel's saved boots (states.py).
An arm whose boots disagree on a count beyond their own trials' spread is
named ("guest states differ", a note, with the functions that differ most
between its boots where its attribution counted each boot); a pair whose
difference lies within what the choice of a boot gives (the ranges of the
two arms' boots overlap) is not comparable on that count.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatch
from typing import TypeVar

import numpy as np

from mmlab.judge import states
from mmlab.workloads.samples import Sample

# The axes that ask for a page state (a mapping's size, alignment or backing
# changes its THP backing by request too).
THP_AXES = frozenset({"thp", "thp_mode", "thp_defrag", "mapping-kb", "size-kb", "backing",
                      "bytes", "align"})
SWAP_AXES = frozenset({"swap"})
KSM_AXES = frozenset({"vmas", "pattern"})
# Where and on what it ran (numa_nodes: a guest's NUMA layout): these may
# differ when these axes do.
PLATFORM_AXES = frozenset({"kernel", "cpus", "memory_mb", "numa_nodes"})


@dataclass(frozen=True)
class Check:
    name: str
    section: str          # "state", "vmstat_delta" or "counts"
    keys: tuple[str, ...]
    allowed_by: frozenset[str]   # axes (or axis prefixes ending in ".") that may change it
    abs_tol: float = 0.0  # numeric state: differences up to this are the same state
    rel_tol: float = 0.0
    presence: bool = False  # compare "happened / in use" (> 0), not the amount
    # Metrics already divided by this state (a sample where it is 0 has no value),
    # or that it cannot touch, which its variation therefore cannot make incomparable.
    normalises: tuple[str, ...] = ()
    page_state: bool = True   # False: the platform (kernel, CPUs) or an actor, not the memory
    # How to read a key from a sample (None: absent); default: the section's value.
    # Keys with "*" stand for every matching key the samples have.
    read: Callable[[Sample, str], object] | None = None
    machine_wide: bool = False   # the whole machine's reading, not the trial's own
    # Why an arm's samples are in this state, in words ("" if nothing to say).
    explain: Callable[[list[Sample]], str] | None = None

    def allowed(self, differing_axes: set[str]) -> bool:
        return any(axis in self.allowed_by or any(axis.startswith(p) for p in self.allowed_by
                                                  if p.endswith("."))
                   for axis in differing_axes)


NOT_AVAILABLE = "not available"
_MTHP_KEY = re.compile(r"mthp_(\d+)kB_")
_MTHP_ENABLED = re.compile(r"mthp_(\d+)kB_enabled")


def _pmd_kb(s: Sample) -> float:
    return float(s.state.get("thp_pmd_size_kb", 2048))


def _anon_thp_sizes(s: Sample, key: str) -> str | None:
    """The anonymous THP sizes in force and their modes ("64kB=always,
    2048kB=madvise"), each size's "inherit" resolved against the top-level
    mode.  A kernel without mTHP has the PMD size alone, under that mode."""
    if "mthp" not in s.state:
        return None
    top = str(s.state.get("thp_enabled"))
    modes = {int(_pmd_kb(s)): top}
    if s.state["mthp"] != NOT_AVAILABLE:
        modes = {int(m[1]): top if v == "inherit" else str(v) for k, v in s.state.items()
                 if (m := _MTHP_ENABLED.fullmatch(k))}
    on = [f"{kb}kB={mode}" for kb, mode in sorted(modes.items())
          if mode not in ("never", "unavailable")]
    return ", ".join(on) or "none"


def _mthp_event(s: Sample, key: str) -> object:
    """A per-size mTHP counter over the sample.  The PMD size is left to the
    THP checks (thp_* in vmstat say the same on every kernel); a kernel
    without mTHP had no smaller anonymous large folios: NOT_AVAILABLE."""
    m = _MTHP_KEY.match(key)
    if m and float(m[1]) >= _pmd_kb(s):
        return None
    if key in s.state:
        return s.state[key]
    return NOT_AVAILABLE if s.state.get("mthp") == NOT_AVAILABLE else None


# mm/huge_memory.c hugepage_init "disable transparent hugepages on smaller
# systems": `totalram_pages() < (512 << (20 - PAGE_SHIFT))` clears every THP
# flag at boot.  totalram_pages is what MemTotal shows, and a 512 MiB guest
# has less (the kernel's own image and reservations): 464 MiB on debian:6.12.
SMALL_SYSTEM_KB = 512 * 1024
SMALL_SYSTEM_RULE = "the kernel turns THP off below 512 MiB of memory"
# A guest's THP flags as it booted, before the arm's settings (targets/qemu.py).
BOOT_THP = ("boot_thp_enabled", "boot_thp_defrag", "boot_thp_use_zero_page",
            "boot_thp_khugepaged_defrag")


def small_system(samples: list[Sample]) -> str:
    """Why these samples' kernel booted with THP off, if its memory is why
    ("" otherwise): "512 MiB guest, MemTotal 482 MiB: the kernel turns THP
    off below 512 MiB of memory"."""
    for s in samples:
        total = s.state.get("mem_total_kb")
        if (s.state.get("boot_thp_enabled") == "never" and isinstance(total, int | float)
                and total < SMALL_SYSTEM_KB):
            guest = s.state.get("guest_memory_mb")
            size = f"{guest:g} MiB guest, " if isinstance(guest, int | float) else ""
            return f"{size}MemTotal {total / 1024:.0f} MiB: {SMALL_SYSTEM_RULE}"
    return ""


def guest_thp_notes(samples: dict[str, list[Sample]]) -> list[str]:
    """For compare and report: the arms whose guest booted with THP off, in
    words, with the mode in force during their trials (the arm's settings
    may have turned it on).  Arms in the same state share one line."""
    groups: dict[str, list[str]] = {}
    for arm, ss in samples.items():
        boot = {str(s.state["boot_thp_enabled"]) for s in ss if "boot_thp_enabled" in s.state}
        if boot != {"never"}:
            continue
        why = small_system(ss)
        during = "/".join(sorted({f"{s.state.get('thp_enabled', '?')}, defrag "
                                  f"{s.state.get('thp_defrag', '?')}" for s in ss}))
        line = (f"guest THP: never at boot{f' ({why})' if why else ''}; "
                f"during the trial: {during}")
        groups.setdefault(line, []).append(arm)
    return [f"{', '.join(arms)}: {line}" for line, arms in groups.items()]


MTHP_COUNTERS = ("anon_fault_alloc", "anon_fault_fallback", "split", "swpout", "swpout_fallback")

# reclaim's figures are per page it reclaimed, swapping out being part of what
# they measure.  What the machine still counts in swap once its sample has
# freed its pages is not the trial's: 6.12 keeps up to 64 freed slots per CPU
# in its swap slot caches (288 KiB after a 64 MiB sample, with mmwork gone),
# 7.3 has no such cache.  So that reading cannot make them incomparable.
PER_PAGE_RECLAIMED = ("reclaim_ns_per_page", "reclaim_ns_per_page_total",
                      "reclaim_kernel_insns_per_page", "reclaim_user_insns_per_page")

# A host trial runs in a memory cgroup of its own (machine/memcg.py), whose
# memory.stat counts the trial's events alone: where a sample has such a
# reading, it decides, and the machine-wide one it replaces is not read.
OWN_READING = {"thp_fault_alloc": "memcg_thp_fault_alloc", "thp_swpout": "memcg_thp_swpout",
               "thp_swpout_fallback": "memcg_thp_swpout_fallback",
               "swap_used_kb": "memcg_swap_kb", "pswpout": "memcg_pswpout"}

CHECKS = (
    Check("THP backing of the mapping", "state",
          ("thp_backed_fraction", "after_prefault_anon_huge_kb", "anon_huge_kb",
           "file_pmd_mapped_kb", "shmem_pmd_mapped_kb"), THP_AXES, abs_tol=0.05, rel_tol=0.10),
    Check("THP mode in force", "state", ("thp_enabled",), frozenset({"thp_mode"}),
          explain=small_system),
    Check("THP defrag mode", "state", ("thp_defrag",), frozenset({"thp_defrag"}),
          explain=small_system),
    # What the arm's settings leave as the kernel booted them (the huge zero
    # page, khugepaged's defrag) differs with them; no axis sets a boot default.
    Check("guest THP at boot", "state", BOOT_THP, frozenset(), explain=small_system),
    Check("THP faults, splits and swap-out fallbacks", "vmstat_delta",
          ("thp_fault_alloc", "thp_split_page", "thp_swpout_fallback", "thp_swpout"),
          THP_AXES | SWAP_AXES, presence=True, machine_wide=True),
    Check("THP faults and swap-outs of the trial's own cgroup", "state",
          ("memcg_thp_fault_alloc", "memcg_thp_swpout", "memcg_thp_swpout_fallback"),
          THP_AXES | SWAP_AXES, presence=True),
    Check("mTHP sizes enabled", "state", ("anon_thp_sizes",), THP_AXES, read=_anon_thp_sizes),
    Check("mTHP allocations, fallbacks, splits and swap-outs", "state",
          tuple(f"mthp_*kB_{c}" for c in MTHP_COUNTERS), THP_AXES | SWAP_AXES, presence=True,
          read=_mthp_event, machine_wide=True),
    Check("swap configured", "state", ("swap_total_kb",), SWAP_AXES),
    # One check over two keys (a finding names the check, not the key).
    Check("swap used", "state", ("after_pageout_swap_kb",), SWAP_AXES, presence=True,
          normalises=PER_PAGE_RECLAIMED),
    Check("swap used", "state", ("swap_used_kb",), SWAP_AXES, presence=True,
          machine_wide=True, normalises=PER_PAGE_RECLAIMED),
    Check("swap used", "state", ("memcg_swap_kb",), SWAP_AXES, presence=True,
          normalises=PER_PAGE_RECLAIMED),
    Check("pages swapped out", "vmstat_delta", ("pswpout",), SWAP_AXES, presence=True,
          machine_wide=True),
    Check("pages swapped out", "state", ("memcg_pswpout",), SWAP_AXES, presence=True),
    Check("KSM merging", "state", ("ksm_merged_fraction",), KSM_AXES | {"ksm."}, abs_tol=0.05),
    Check("KSM running", "state", ("ksm_run",), frozenset({"ksm."})),
    Check("VMA count of the mapping", "state", ("vmas_actual",), KSM_AXES, rel_tol=0.01),
    # Compaction reaches a page or not depending on where it sits: a walk that
    # migrated nothing is a different experiment from one that migrated all.
    Check("KSM pages compaction moved", "counts", ("ksm_pages_migrated",), KSM_AXES,
          presence=True, normalises=("ms_per_migrated_page",)),
    # The kernel's own actors: only an axis that sets the very actor explains them.
    # DAMON samples access by clearing young bits: the damon axis (off) sets it.
    Check("DAMON running", "state", ("damon",), frozenset({"damon"}), page_state=False),
    Check("kernel mm actors", "state", ("khugepaged",), frozenset(), page_state=False),
    Check("kernel mm actors", "state", ("ksmd",), frozenset({"ksm.run"}), page_state=False),
    Check("kernel mm actors", "state", ("compaction_proactiveness",),
          frozenset({"sysctl.vm.compaction_proactiveness"}), page_state=False),
    Check("page size", "state", ("page_size_kb", "after_prefault_kernel_page_kb"),
          frozenset({"kernel"}), page_state=False),
    Check("kernel", "state", ("kernel",), frozenset({"kernel"}), page_state=False),
    Check("MGLRU", "state", ("lru_gen_enabled",), frozenset({"kernel", "sysctl."}),
          page_state=False),
    Check("online CPUs", "state", ("online_cpus", "guest_vcpus"), frozenset({"kernel", "cpus"}),
          page_state=False),
    Check("guest memory", "state", ("mem_total_kb", "guest_memory_mb"),
          frozenset({"kernel", "memory_mb"}), rel_tol=0.02, page_state=False),
    # The free-memory watermark scales with memory and rises when khugepaged
    # starts (set_recommended_min_free_kbytes), so THP's mode moves it too.
    Check("min_free_kbytes", "state", ("min_free_kbytes",),
          frozenset({"kernel", "memory_mb", "numa_nodes", "thp_mode",
                     "sysctl.vm.min_free_kbytes"}), rel_tol=0.02, page_state=False),
    # Host against guest, KVM against TCG, a guest against bare metal (or a
    # simulated machine): different clocks, never comparable.
    Check("where it ran (host, KVM or TCG guest, bare metal)", "state", ("target", "accelerator"),
          frozenset(), page_state=False),
)


@dataclass(frozen=True)
class Finding:
    check: str
    arms: tuple[str, ...]
    detail: str
    beside: str = ""      # a machine-wide difference with a neighbour there: who
    only: tuple[str, ...] | None = None   # the metrics it concerns alone (None: any)

    def __str__(self) -> str:
        return f"{self.check}: {self.detail}" + (f" ({self.beside})" if self.beside else "")

    def matters_for(self, metric: str) -> bool:
        """Does it make `metric`'s comparison incomparable?  Not when a
        neighbour may explain it, nor for a metric divided by that state,
        nor for one it does not concern."""
        check = next((c for c in CHECKS if c.name == self.check), None)
        return (not self.beside and (self.only is None or metric in self.only)
                and (check is None or metric not in check.normalises))


NEIGHBOUR_SHARE = 0.05   # of the machine's CPU time: more, and something else ran beside


def neighbour(samples: list[Sample]) -> str:
    """Who ran beside these samples, in words ("" if nobody did): the
    largest share of the machine's CPU that other processes took."""
    shares = [float(v) for s in samples
              if isinstance(v := s.state.get("neighbour_cpu_share"), int | float)]
    busy = [x for x in shares if x > NEIGHBOUR_SHARE]
    if not busy:
        return ""
    return (f"machine-wide; beside a neighbour that took up to {max(busy):.0%} of the "
            f"machine's CPU in {len(busy)} of {len(shares)} samples")


def _keys(check: Check, *arms: list[Sample]) -> list[str]:
    """The check's keys, each pattern expanded over the keys the samples
    have; a machine-wide key that every sample also read in its own cgroup
    (OWN_READING) is left to that reading."""
    keys: list[str] = []
    for key in check.keys:
        own = OWN_READING.get(key) if check.machine_wide else None
        if own and all(own in s.state for samples in arms for s in samples):
            continue
        if "*" not in key:
            keys.append(key)
            continue
        have = {k for samples in arms for s in samples for k in getattr(s, check.section)}
        keys += sorted((k for k in have if fnmatch(k, key)), key=_natural)
    return keys


def _natural(key: str) -> tuple:
    """mthp_16kB_... before mthp_128kB_...: numbers compared as numbers."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key))


def _values(samples: list[Sample], check: Check, key: str) -> list:
    if check.read:
        return [v for s in samples if (v := check.read(s, key)) is not None]
    return [getattr(s, check.section)[key] for s in samples if key in getattr(s, check.section)]


_V = TypeVar("_V")


def _amount(v: _V) -> _V | float:
    """An event count; "not available" (the kernel cannot do it) is none."""
    return 0.0 if v == NOT_AVAILABLE else v


def _describe(values: list) -> str:
    if values and all(isinstance(v, int | float) for v in values):
        lo, hi = min(values), max(values)
        return f"{lo:g}" if lo == hi else f"{lo:g}..{hi:g}"
    return "/".join(sorted(set(map(str, values))))


def _same(check: Check, a: list, b: list) -> bool:
    if not a or not b:
        return not a and not b
    if check.presence:
        a, b = [_amount(v) for v in a], [_amount(v) for v in b]
    if not all(isinstance(v, int | float) for v in a + b):
        return set(map(str, a)) == set(map(str, b))
    ma, mb = float(np.median(a)), float(np.median(b))
    if check.presence:
        return (ma > 0) == (mb > 0)
    return abs(ma - mb) <= max(check.abs_tol, check.rel_tol * max(abs(ma), abs(mb)))


def _why(check: Check, arms: tuple[tuple[str, list[Sample]], ...]) -> str:
    """The check's explanation of each arm's state, as a finding's tail."""
    whys = [f"{arm}: {why}" for arm, ss in arms if check.explain and (why := check.explain(ss))]
    return f" ({'; '.join(whys)})" if whys else ""


def audit_arm(arm: str, samples: list[Sample],
              functions: Mapping[str, states.ByFunction] | None = None) -> list[Finding]:
    """Samples of one arm that ran in different states; `functions`: its
    counts by function from each saved boot, if its attribution made them."""
    found = []
    for check in CHECKS:
        for key in _keys(check, samples):
            vals = _values(samples, check, key)
            if len(vals) < 2:
                continue
            if check.presence:
                # Amounts vary by nature; whether it happened at all must not.
                same = len({_amount(v) > 0 for v in vals}) == 1
            elif all(isinstance(v, int | float) for v in vals):
                lo, hi = min(vals), max(vals)
                same = hi - lo <= max(check.abs_tol, check.rel_tol * max(abs(lo), abs(hi)))
            else:
                same = len(set(map(str, vals))) == 1
            if not same:
                found.append(Finding(check.name, (arm,),
                                     f"{key} varied within arm {arm}: {_describe(vals)}",
                                     neighbour(samples) if check.machine_wide else ""))
    found += states_differ(arm, samples, functions)
    errors: dict[str, float] = {}
    for s in samples:
        for k, v in s.errors.items():
            errors[k] = errors.get(k, 0) + v
    if errors:
        found.append(Finding("failed calls", (arm,), f"arm {arm} counted " + ", ".join(
            f"{k} x{v:g}" for k, v in errors.items())))
    return found


def audit_pair(arm: str, baseline: str, samples: list[Sample], base_samples: list[Sample],
               differing_axes: set[str]) -> list[Finding]:
    """State differences between two arms that no differing axis explains."""
    if not samples or not base_samples:
        return []   # an arm whose trials all failed has no state; its verdict says so
    blind = [name for name, ss in ((arm, samples), (baseline, base_samples))
             if any(s.params.get("no-probes") is True for s in ss)]
    if blind:
        return [Finding("page state measured", (arm, baseline),
                        f"{' and '.join(blind)} ran with --no-probes: no page state to "
                        "compare, so the same state cannot be shown")]
    found = states_explain(arm, baseline, samples, base_samples)
    culprits = sorted(differing_axes & PLATFORM_AXES)
    for check in CHECKS:
        if check.allowed(differing_axes):
            continue
        cause = (f": the {' and '.join(culprits)} changed the page state"
                 if check.page_state and culprits else "")
        cause += _why(check, ((arm, samples), (baseline, base_samples)))
        for key in _keys(check, samples, base_samples):
            a = _values(samples, check, key)
            b = _values(base_samples, check, key)
            if not _same(check, a, b):
                found.append(Finding(check.name, (arm, baseline),
                                     f"{key} {_describe(a) or 'absent'} in {arm} vs "
                                     f"{_describe(b) or 'absent'} in {baseline}{cause}",
                                     neighbour(samples + base_samples)
                                     if check.machine_wide else ""))
    return found


STATES_DIFFER = "guest states differ"
STATES_EXPLAIN = "saved boots explain the difference"


def states_differ(arm: str, samples: list[Sample],
                  functions: Mapping[str, states.ByFunction] | None = None) -> list[Finding]:
    """The arm's counts on which its saved boots disagree (states.disagree,
    naming the functions where `functions` holds the arm's counts by
    function from each boot): one finding that concerns no verdict by
    itself (`only` empty)."""
    detail = states.disagree(samples, functions)
    return [Finding(STATES_DIFFER, (arm,), f"arm {arm}: {detail}", only=())] if detail else []


def states_explain(arm: str, baseline: str, samples: list[Sample],
                   base_samples: list[Sample]) -> list[Finding]:
    """Counts whose difference between the arms the choice of a saved boot
    explains (states.explained): each not comparable for the pair."""
    return [Finding(STATES_EXPLAIN, (arm, baseline), detail, only=(metric,))
            for metric, detail in states.explained(arm, baseline, samples, base_samples)]
