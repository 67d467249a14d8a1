"""`make bench`: mmlab's figures next to a peer's, measured side by side in one run.

1. mremap-churn against `stress-ng --mremap N --mremap-bytes B --metrics-brief`
   with the same workers and bytes, interleaved (A B A B) so that drift on a
   noisy machine hits both alike.  stress-ng divides --mremap-bytes by the
   instance count (at least one page), so mmwork gets that per-worker size.
2. pageout-refault sample-to-sample CV, the stability a verdict rests on.

Figures are printed as ratios; nothing here asserts a speed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from rich.table import Table

from . import workloads
from .report.terminal import console, fmt, pct
from .stats import summarize
from .targets import host

CASES = [(1, 4096), (2, 8192), (2, 256 * 1024)]   # (workers, stress-ng --mremap-bytes)
SECONDS = 3
ROUNDS = 2


def stress_ng_mremap(workers: int, total_bytes: int, seconds: float) -> dict[str, float]:
    """stress-ng's own figures for one run, read from its YAML output."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "sng.yaml")
        subprocess.run(["stress-ng", "--mremap", str(workers), "--mremap-bytes",
                        str(total_bytes), "--timeout", f"{seconds}s", "--metrics-brief",
                        "--yaml", str(out)], capture_output=True, check=True)
        text = out.read_text()
    def field(name: str) -> float:
        m = re.search(rf"^\s+{name}: ([0-9.]+)$", text, re.M)
        if not m:
            raise RuntimeError(f"stress-ng YAML has no {name}")
        return float(m.group(1))
    return {"ops_per_s_real": field("bogo-ops-per-second-real-time"),
            "ops_per_s_cpu": field("bogo-ops-per-second-usr-sys-time")}


def mmwork_mremap(workers: int, total_bytes: int, seconds: float) -> dict[str, float]:
    per_worker = max(4096, total_bytes // workers // 4096 * 4096)
    wl = workloads.get("mremap-churn")
    (sample,) = host.run(wl, {"workers": workers, "bytes": per_worker, "seconds": seconds},
                         samples=1)
    return {k: sample.metrics[k] for k in ("ops_per_s_real", "ops_per_s_cpu")}


def mremap_table() -> Table:
    table = Table(title=f"mremap-churn vs stress-ng --mremap ({SECONDS} s runs, "
                        f"{ROUNDS} interleaved rounds, medians)")
    for col in ("workers", "bytes (stress-ng)", "ops/s real: stress-ng", "mmwork", "ratio",
                "ops/s usr+sys: stress-ng", "mmwork", "ratio"):
        table.add_column(col, justify="right")
    for workers, total in CASES:
        peer, ours = [], []
        for _ in range(ROUNDS):
            peer.append(stress_ng_mremap(workers, total, SECONDS))
            ours.append(mmwork_mremap(workers, total, SECONDS))
        row = [str(workers), str(total)]
        for key in ("ops_per_s_real", "ops_per_s_cpu"):
            p = summarize([r[key] for r in peer]).median
            o = summarize([r[key] for r in ours]).median
            row += [fmt(p), fmt(o), f"{o / p:.2f}x"]
        table.add_row(*row)
    return table


def pageout_cv_table(reps: int = 10) -> Table:
    wl = workloads.get("pageout-refault")
    table = Table(title=f"pageout-refault stability: {reps} samples, one process each")
    for col in ("thp", "metric", "median", "CV", "min/median", "max/median"):
        table.add_column(col, justify="right")
    for thp in ("default", "hugepage"):
        samples = [host.run(wl, {"thp": thp}, samples=1)[0] for _ in range(reps)]
        for metric in ("cycle_ns_per_page", "advise_ns_per_page"):
            s = summarize([x.metrics[metric] for x in samples])
            table.add_row(thp, metric, fmt(s.median), pct(s.cv), f"{s.min / s.median:.3f}",
                          f"{s.max / s.median:.3f}")
    return table


def main() -> None:
    out = console()
    if shutil.which("stress-ng"):
        out.print(mremap_table())
    else:
        out.print("stress-ng is not installed: the side-by-side part is skipped "
                  "(`make setup` installs it)")
    out.print(pageout_cv_table())


if __name__ == "__main__":
    main()
