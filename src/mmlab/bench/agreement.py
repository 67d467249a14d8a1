"""Does mmlab measure what the reporter measured?  Two checks of it,
measured side by side (`python -m mmlab.bench --part agreement`):

1. `mmlab run pageout-refault --align none` against
   experiments/repro/pageout_repro.c, a single-file reproducer of the same
   loop that shares no code with mmwork, run as an exec source workload.
   Same statistic on both sides: total time over total pages (mmwork's
   `_total` metrics, the reproducer's only figures).  Bound: +-3%.
2. `mmlab run exec -- stress-ng --mremap 2 --mremap-bytes 4K --timeout 3
   --metrics-brief -Y {out}` against the same stress-ng command run
   directly (no mmwork around it), on the host and in a guest.  Bound: +-5%.

Pairs are interleaved, and which side goes first alternates (A B, B A, ...),
so drift and order hit both alike.  The figure is the ratio of the two
sides' medians.  Nothing here asserts a speed: it prints what it measured.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.table import Table

from mmlab import workloads
from mmlab.judge.stats import summarize
from mmlab.kernels import images
from mmlab.machine.knobs import HostSettings
from mmlab.targets import boot, initramfs, qemu
from mmlab.workloads import execwork, mmwork
from mmlab.workloads.build import REPO_ROOT

REPRO = "experiments/repro/pageout_repro.c"
PAGEOUT_BOUND = 0.03
STRESS_NG_BOUND = 0.05
STRESS_NG = ["stress-ng", "--mremap", "2", "--mremap-bytes", "4K", "--timeout", "3",
             "--metrics-brief"]
STRESS_NG_METRICS = ("ops_per_s_real", "ops_per_s_cpu")
GUEST_YAML = "/tmp/stress-ng.yaml"


@dataclass
class Agreement:
    case: str
    metric: str          # mmlab's side; the peer's figure is named in `peer_metric`
    peer_metric: str
    ours: list[float]
    peer: list[float]
    bound: float

    @property
    def ratio(self) -> float:
        return summarize(self.ours).median / summarize(self.peer).median

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1) <= self.bound


def interleaved(pairs: int, ours: Callable[[], dict], peer: Callable[[], dict]
                ) -> tuple[list[dict], list[dict]]:
    """`pairs` runs of each, alternating which one goes first."""
    a, b = [], []
    for i in range(pairs):
        if i % 2:
            b.append(peer())
            a.append(ours())
        else:
            a.append(ours())
            b.append(peer())
    return a, b


def repro_workload() -> execwork.ExecWorkload:
    return execwork.build(["{source}"], source=REPRO, base=REPO_ROOT, metrics_from="key=value",
                          declared={"advise_ns_per_page": "lower",
                                    "cycle_ns_per_page": "lower"})


def pageout(pairs: int = 10) -> list[Agreement]:
    """mmwork's pageout-refault (one process per sample, its own warm-up)
    against the reproducer, as `mmlab run` runs each."""
    wl, repro = workloads.get("pageout-refault"), repro_workload()
    ours, peer = interleaved(
        pairs, lambda: mmwork.sample(wl, {"align": "none"}, samples=1)[0].metrics,
        lambda: mmwork.sample(repro, {}, samples=1)[0].metrics)
    case = "pageout-refault vs pageout_repro.c (host)"
    return [Agreement(case, f"{m}_total", m, [o[f"{m}_total"] for o in ours],
                      [p[m] for p in peer], PAGEOUT_BOUND)
            for m in ("advise_ns_per_page", "cycle_ns_per_page")]


def stress_ng_workload() -> execwork.ExecWorkload:
    return execwork.build([*STRESS_NG, "-Y", "{out}"], metrics_from="stress-ng-yaml")


def stress_ng_host(pairs: int = 5) -> list[Agreement]:
    wl = stress_ng_workload()
    ours, peer = interleaved(pairs, lambda: mmwork.sample(wl, {}, samples=1)[0].metrics,
                             lambda: execwork.run_stress_ng(STRESS_NG, STRESS_NG_METRICS))
    return [Agreement("mmlab run exec -- stress-ng vs stress-ng (host)", m, m,
                      [o[m] for o in ours], [p[m] for p in peer], STRESS_NG_BOUND)
            for m in STRESS_NG_METRICS]


def stress_ng_guest(kernel: str, pairs: int = 8, vcpus: int = 1) -> list[Agreement]:
    """The same in a guest: one boot per run, mmwork exec's trial against a
    /trial.sh that runs stress-ng alone, both with the same packed files."""
    wl = stress_ng_workload()
    guest = boot.Guest(images.get(kernel), vcpus=vcpus, memory_mb=1024, timeout_s=300)
    accel, _ = boot.accelerator(guest.kernel, boot.initramfs_cache())
    archives = (initramfs.files_archive(wl.programs({}), boot.initramfs_cache()),)
    script = (" ".join([*STRESS_NG, "-Y", GUEST_YAML]) + " > /dev/null 2>&1\n"
              f"cat {GUEST_YAML}\n")
    ours, peer = interleaved(
        pairs, lambda: qemu.sample(guest, wl, {}, 1, 0, HostSettings())[0].metrics,
        lambda: execwork.stress_ng_figures(boot.run_script(guest, script, archives),
                                           STRESS_NG_METRICS))
    return [Agreement(f"mmlab run exec -- stress-ng vs stress-ng ({kernel}, {vcpus} vCPUs, "
                      f"{accel.upper()})", m, m, [o[m] for o in ours], [p[m] for p in peer],
                      STRESS_NG_BOUND)
            for m in STRESS_NG_METRICS]


def table(found: list[Agreement]) -> Table:
    t = Table(title="mmlab beside the reporter's tools: interleaved pairs, medians")
    for col in ("case", "mmlab metric", "mmlab", "peer", "ratio", "bound", "within"):
        t.add_column(col, justify="right" if col not in ("case", "mmlab metric") else "left")
    for a in found:
        t.add_row(a.case, a.metric, f"{summarize(a.ours).median:,.1f}",
                  f"{summarize(a.peer).median:,.1f}", f"{a.ratio:.3f}",
                  f"±{a.bound:.0%}", "yes" if a.within else "NO")
    return t
