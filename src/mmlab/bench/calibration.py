"""`make bench`, calibration part: how far emulated time can be trusted.

Pairs of settings run twice, in one bench run: on this machine's own kernel
(the host) and in a TCG guest of the same series.  For each pair the part
prints the time ratio (arm over baseline) on both sides, the ratio of the
guest's exact instruction counts, and whether the directions agree: where
the emulated time ratio points the way the host's does, emulated time has
followed the machine on that path; where it does not, only counts (or
hardware) can decide there.

Each side is one experiment per workload (both arms interleaved, paired
rounds), judged by the usual comparison: the ratio is the paired estimate.
A ratio within ±`SAME` of 1 has no direction ("="): two sides agree when
they fall in the same of the three classes.
"""

from __future__ import annotations

import math
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tomli_w
from rich.table import Table

from mmlab.experiment.plan import Plan, parse
from mmlab.judge.comparison import Comparison
from mmlab.report.fmt import ratio as fmt_ratio
from mmlab.run import driver
from mmlab.run.events import Event, Message
from mmlab.store import Store
from mmlab.targets import TargetPool
from mmlab.workloads import insns
from mmlab.workloads.build import REPO_ROOT

SAME = 0.03            # ratios within 3% of 1 point nowhere


@dataclass(frozen=True)
class TimeAndCount:
    """One pair of settings on one workload: a time metric and its count."""
    label: str
    time: str
    count: str


@dataclass(frozen=True)
class Case:
    """One workload's experiment: its profile keys (both arms) and its pairs."""
    name: str
    keys: dict
    pairs: tuple[TimeAndCount, ...]


CASES = (
    Case("pageout-refault", {
        "workload": "pageout-refault", "warmups": 1, "params": {"mapping-kb": 16384,
                                                               "min-ms": 200},
        "matrix": {"thp": ["nohugepage", "hugepage"]}, "baseline": {"thp": "nohugepage"}},
        (TimeAndCount("THP / 4 KiB: MADV_PAGEOUT", "advise_ns_per_page",
              "advise_kernel_insns_per_page"),
         TimeAndCount("THP / 4 KiB: refault", "post_touch_ns_per_page",
              "post_touch_kernel_insns_per_page"),
         TimeAndCount("THP / 4 KiB: first touch", "prefault_ns_per_page",
              "prefault_kernel_insns_per_page"))),
    Case("ksm-rmap", {
        "workload": "ksm-rmap", "host_changes": True, "params": {"pattern": "guard"},
        "matrix": {"vmas": [500, 2000]}, "baseline": {"vmas": 500}},
        (TimeAndCount("rmap walk: 2,000 / 500 VMAs", "ms_per_migrated_page",
              "walk_kernel_insns_per_migrated_page"),)),
    Case("unmap-young", {
        "workload": "unmap-young", "warmups": 1,
        "params": {"backing": "shmem", "size-kb": 16384, "page-state": "cold"},
        "matrix": {"sequential": [False, True]}, "baseline": {"sequential": False}},
        (TimeAndCount("unmap: old (VM_SEQ_READ) / young", "unmap_ns_per_page",
              "unmap_kernel_insns_per_page"),
         TimeAndCount("touch: old / young (same work)", "touch_ns_per_page",
              "touch_kernel_insns_per_page"))),
    Case("populate-unmap", {
        "workload": "populate-unmap", "params": {"workers": 1, "seconds": 0.5},
        "matrix": {"bytes": [4096, 65536]}, "baseline": {"bytes": 4096}},
        (TimeAndCount("populate: 64 KiB / 4 KiB mappings", "populate_ns_per_page",
              "populate_kernel_insns_per_page"),
         TimeAndCount("unmap: 64 KiB / 4 KiB mappings", "unmap_ns_per_page",
              "unmap_kernel_insns_per_page"))),
    Case("exec", {
        "workload": "exec", "source": str(REPO_ROOT / "experiments/repro/mprotect_repro.c"),
        "command": ["{source}", "{pages}"], "metrics_from": "key=value", "warmups": 1,
        "exec_metrics": {"ns_per_page": "lower"},
        "windows": {"protect": {"id": 1, "per": "pages"}},
        "matrix": {"pages": [512, 4096]}, "baseline": {"pages": 512}},
        (TimeAndCount("exec mprotect: 4,096 / 512 pages", "ns_per_page",
              "protect_kernel_insns_per_pages"),)),
)


def same_series_guest() -> str:
    """The Debian kernel of this machine's own series (6.18.44 -> debian:6.18)."""
    m = re.match(r"(\d+\.\d+)", platform.release())
    return f"debian:{m.group(1)}" if m else "debian:6.12"


def profile(case: Case, kernel: str, rounds: int, counted: bool) -> Plan:
    """The case's profile on one side: its time metrics, and its counts
    where that side can count them."""
    metrics = [p.time for p in case.pairs] + ([p.count for p in case.pairs] if counted else [])
    doc = {"name": f"calibration-{case.name}-{'host' if kernel == 'host' else 'tcg'}",
           "kernel": kernel, "repetitions": rounds, "metrics": metrics, "tolerance": SAME,
           "max_cv": 0.5, "seed": 7, **case.keys}
    if kernel != "host":
        doc["memory_mb"] = 1024
        doc["cmdline"] = "damon_stat.enabled=N"
    return parse(tomli_w.dumps(doc), f"calibration {case.name}")


@dataclass
class Row:
    """One pair's ratios: the host's time, the guest's time and count (None
    where that side has no figure: a metric no trial gave, no counter)."""
    pair: TimeAndCount
    host: float | None
    tcg: float | None
    counted: float | None

    def agree(self, other: float | None) -> str:
        """Does `other` point the way the host's time does?"""
        if self.host is None or other is None:
            return "-"
        return "yes" if direction(self.host) == direction(other) else "NO"


def direction(r: float) -> str:
    return "+" if r > 1 + SAME else "-" if r < 1 - SAME else "="


def ratio(found: dict[str, Comparison], metric: str) -> float | None:
    """The comparison's paired ratio, or None where it has none."""
    c = found.get(metric)
    return c.ratio if c and math.isfinite(c.ratio) else None


def run_side(store: Store, plan: Plan, say: Callable[[str], None]) -> dict[str, Comparison]:
    """One side's experiment, judged: its comparisons by metric, of the
    planned pair (not of the matched-state controls the run added).  A pair
    in different page state keeps its ratio here: the table asks which way
    each side's time points, and the docs say where state differed."""
    def told(event: Event) -> None:
        if isinstance(event, Message):
            say(event.text)
    ran = driver.run_experiment(store, plan, driver.Here(TargetPool(True, say)),
                                on_event=told)
    planned = {a.name for a in ran.result.plan.arms if a.control_of is None}
    return {c.metric: c for c in ran.result.judgement.comparisons if c.arm in planned}


def measure(results: Path, guest: str, rounds: int,
            say: Callable[[str], None]) -> list[Row]:
    """Every case on the host and in the guest, one after the other."""
    store = Store(results)
    host_counts = insns.perf_status()[0]
    rows = []
    for case in CASES:
        say(f"calibration: {case.name} on the host, then in {guest} (TCG)")
        host = run_side(store, profile(case, "host", rounds, host_counts), say)
        tcg = run_side(store, profile(case, guest, rounds, True), say)
        rows += [Row(p, ratio(host, p.time), ratio(tcg, p.time), ratio(tcg, p.count))
                 for p in case.pairs]
    return rows


def table(rows: list[Row], guest: str, rounds: int) -> Table:
    t = Table(title=f"emulated time against this machine's: {platform.release()} (host) and "
                    f"{guest} (TCG), {rounds} paired rounds each, ratio arm / baseline")
    for col in ("pair", "time metric", "host time", "TCG time", "TCG count",
                "time agrees", "count agrees with host time"):
        t.add_column(col, justify="left" if col in ("pair", "time metric") else "right")
    for r in rows:
        t.add_row(r.pair.label, r.pair.time, *(fmt_ratio(x, "x") for x in (r.host, r.tcg,
                                                                         r.counted)),
                  r.agree(r.tcg), r.agree(r.counted))
    return t
