"""Same-state audit: did two arms really run in the same page state?

A timing difference means something only if the memory was in the state the
profile asked for.  Seed 001's headline ratio was undone because the two
kernels had not given the mapping the same THP backing; this module looks
for exactly that.  Each check reads measured state from the samples and
names the axes that are *allowed* to change it: if two arms differ in that
state while none of those axes differ between them, the pair is not
comparable.  An arm whose own samples disagree (some THP-backed, some not)
is flagged too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .samples import Sample

THP_AXES = frozenset({"thp", "thp_mode", "thp_defrag", "mapping-kb", "size-kb", "backing",
                      "bytes", "kernel"})
SWAP_AXES = frozenset({"swap", "kernel"})
KSM_AXES = frozenset({"vmas", "pattern", "kernel"})


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
    # which its variation therefore cannot make incomparable.
    normalises: tuple[str, ...] = ()

    def allowed(self, differing_axes: set[str]) -> bool:
        return any(axis in self.allowed_by or any(axis.startswith(p) for p in self.allowed_by
                                                  if p.endswith("."))
                   for axis in differing_axes)


CHECKS = (
    Check("THP backing of the mapping", "state",
          ("thp_backed_fraction", "after_prefault_anon_huge_kb", "anon_huge_kb",
           "file_pmd_mapped_kb", "shmem_pmd_mapped_kb"), THP_AXES, abs_tol=0.05, rel_tol=0.10),
    Check("THP mode in force", "state", ("thp_enabled",), frozenset({"thp_mode"})),
    Check("THP defrag mode", "state", ("thp_defrag",), frozenset({"thp_defrag"})),
    Check("THP faults, splits and swap-out fallbacks", "vmstat_delta",
          ("thp_fault_alloc", "thp_split_page", "thp_swpout_fallback", "thp_swpout"),
          THP_AXES | SWAP_AXES, presence=True),
    Check("swap configured", "state", ("swap_total_kb",), SWAP_AXES),
    Check("swap used", "state", ("swap_used_kb", "after_pageout_swap_kb"), SWAP_AXES,
          presence=True),
    Check("pages swapped out", "vmstat_delta", ("pswpout",), SWAP_AXES, presence=True),
    Check("KSM merging", "state", ("ksm_merged_fraction",), KSM_AXES | {"ksm."}, abs_tol=0.05),
    Check("KSM running", "state", ("ksm_run",), frozenset({"ksm."})),
    Check("VMA count of the mapping", "state", ("vmas_actual",), KSM_AXES, rel_tol=0.01),
    # Compaction reaches a page or not depending on where it sits: a walk that
    # migrated nothing is a different experiment from one that migrated all.
    Check("KSM pages compaction moved", "counts", ("ksm_pages_migrated",), KSM_AXES,
          presence=True, normalises=("ms_per_migrated_page",)),
    Check("page size", "state", ("page_size_kb", "after_prefault_kernel_page_kb"),
          frozenset({"kernel"})),
    Check("kernel", "state", ("kernel",), frozenset({"kernel"})),
    Check("MGLRU", "state", ("lru_gen_enabled",), frozenset({"kernel", "sysctl."})),
    Check("online CPUs", "state", ("online_cpus", "guest_vcpus"), frozenset({"kernel", "cpus"})),
    Check("guest memory", "state", ("mem_total_kb", "guest_memory_mb"),
          frozenset({"kernel", "memory_mb"}), rel_tol=0.02),
    # Host against guest, or KVM against TCG: different clocks, never comparable.
    Check("where it ran (host, KVM or TCG guest)", "state", ("target", "accelerator"),
          frozenset()),
)


@dataclass(frozen=True)
class Finding:
    check: str
    arms: tuple[str, ...]
    detail: str

    def __str__(self) -> str:
        return f"{self.check}: {self.detail}"

    def matters_for(self, metric: str) -> bool:
        check = next((c for c in CHECKS if c.name == self.check), None)
        return check is None or metric not in check.normalises


def _values(samples: list[Sample], section: str, key: str) -> list:
    return [getattr(s, section)[key] for s in samples if key in getattr(s, section)]


def _describe(values: list) -> str:
    if values and all(isinstance(v, int | float) for v in values):
        lo, hi = min(values), max(values)
        return f"{lo:g}" if lo == hi else f"{lo:g}..{hi:g}"
    return "/".join(sorted(set(map(str, values))))


def _same(check: Check, a: list, b: list) -> bool:
    if not a or not b:
        return not a and not b
    if not all(isinstance(v, int | float) for v in a + b):
        return set(map(str, a)) == set(map(str, b))
    ma, mb = float(np.median(a)), float(np.median(b))
    if check.presence:
        return (ma > 0) == (mb > 0)
    return abs(ma - mb) <= max(check.abs_tol, check.rel_tol * max(abs(ma), abs(mb)))


def audit_arm(arm: str, samples: list[Sample]) -> list[Finding]:
    """Samples of one arm that ran in different states."""
    found = []
    for check in CHECKS:
        for key in check.keys:
            vals = _values(samples, check.section, key)
            if len(vals) < 2:
                continue
            if check.presence:
                # Amounts vary by nature; whether it happened at all must not.
                same = len({v > 0 for v in vals}) == 1
            elif all(isinstance(v, int | float) for v in vals):
                lo, hi = min(vals), max(vals)
                same = hi - lo <= max(check.abs_tol, check.rel_tol * max(abs(lo), abs(hi)))
            else:
                same = len(set(map(str, vals))) == 1
            if not same:
                found.append(Finding(check.name, (arm,),
                                     f"{key} varied within arm {arm}: {_describe(vals)}"))
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
    found = []
    for check in CHECKS:
        if check.allowed(differing_axes):
            continue
        for key in check.keys:
            a = _values(samples, check.section, key)
            b = _values(base_samples, check.section, key)
            if not _same(check, a, b):
                found.append(Finding(check.name, (arm, baseline),
                                     f"{key} {_describe(a) or 'absent'} in {arm} vs "
                                     f"{_describe(b) or 'absent'} in {baseline}"))
    return found
