"""`make bench`: mmlab's figures next to a peer's, measured side by side in one run.

1. mremap-churn against `stress-ng --mremap N --mremap-bytes B --metrics-brief`
   with the same workers and bytes, interleaved (A B A B) so that drift on a
   noisy machine hits both alike.  stress-ng divides --mremap-bytes by the
   instance count (at least one page), so mmwork gets that per-worker size.
2. pageout-refault sample-to-sample CV, the stability a verdict rests on,
   and (agreement.py) mmlab beside the reporter's tools: pageout-refault
   against a single-file reproducer of its loop, and `mmlab run exec --
   stress-ng` against stress-ng run directly, on the host and in a guest.
3. A guest trial booted against the same trial restored from a saved boot
   (guest_start.py), interleaved, as a ratio.
4. The verdicts' operating characteristics at the defaults, by simulation
   (`mmlab selftest verdicts`), and the verdicts of two real profiles, the
   A/A check and the THP modes, run while a noisy neighbour (a process
   burning a CPU, on and off every few seconds) shares the machine.
5. How long `mmlab` takes to start when it has nothing to run (its version,
   its help, a one-line error), beside `python -c pass` and `git --version`
   (startup.py).
6. How far emulated time can be trusted (calibration.py): pairs of settings
   on this machine's kernel and in a TCG guest of its series, the time
   ratios on both sides beside the guest's counted ratio.
7. What counting events costs a counted guest trial, beside counting
   instructions alone, interleaved (event_cost.py).

Figures are printed as ratios; nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

import tomli_w
from rich.table import Table

from mmlab import workloads
from mmlab.bench import agreement, calibration, census, event_cost, guest_start, startup
from mmlab.errors import Interrupted, MmlabError
from mmlab.experiment.plan import Plan, load
from mmlab.experiment.profile import Profile
from mmlab.judge import criteria, verdicts
from mmlab.judge.stats import summarize
from mmlab.report.fmt import num, pct
from mmlab.report.terminal import console, plain
from mmlab.report.terminal import selftest as selftest_report
from mmlab.run import driver, runner
from mmlab.run.events import Created, Event, Message
from mmlab.store import Store
from mmlab.targets import TargetPool
from mmlab.workloads import execwork, mmwork
from mmlab.workloads.build import REPO_ROOT

CASES = [(1, 4096), (2, 8192), (2, 256 * 1024)]   # (workers, stress-ng --mremap-bytes)
SECONDS = 3
ROUNDS = 2


def stress_ng_mremap(workers: int, total_bytes: int, seconds: float) -> dict[str, float | None]:
    """stress-ng's own figures for one run, read from its YAML output."""
    return execwork.run_stress_ng(["stress-ng", "--mremap", str(workers), "--mremap-bytes",
                                   str(total_bytes), "--timeout", f"{seconds}s",
                                   "--metrics-brief"], ("ops_per_s_real", "ops_per_s_cpu"))


def mmwork_mremap(workers: int, total_bytes: int, seconds: float) -> dict[str, float | None]:
    per_worker = max(4096, total_bytes // workers // 4096 * 4096)
    wl = workloads.get("mremap-churn")
    (sample,) = mmwork.sample(wl, {"workers": workers, "bytes": per_worker, "seconds": seconds},
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
            p = summarize([v for r in peer if (v := r[key]) is not None]).median
            o = summarize([v for r in ours if (v := r[key]) is not None]).median
            row += [num(p), num(o), f"{o / p:.2f}x"]
        table.add_row(*row)
    return table


def pageout_cv_table(reps: int = 10) -> Table:
    wl = workloads.get("pageout-refault")
    table = Table(title=f"pageout-refault stability: {reps} samples, one process each")
    for col in ("thp", "metric", "median", "CV", "min/median", "max/median"):
        table.add_column(col, justify="right")
    for thp in ("default", "hugepage"):
        samples = [mmwork.sample(wl, {"thp": thp}, samples=1)[0] for _ in range(reps)]
        for metric in ("cycle_ns_per_page", "advise_ns_per_page"):
            s = summarize([v for x in samples if (v := x.metrics[metric]) is not None])
            table.add_row(thp, metric, num(s.median), pct(s.cv), f"{s.min / s.median:.3f}",
                          f"{s.max / s.median:.3f}")
    return table


# ---------------------------------------------------------------- a noisy neighbour

BURNER = """\
import os, sys, time
parent, period = os.getppid(), float(sys.argv[1])
while os.getppid() == parent:               # gone with the process that started it
    if int(time.monotonic() / period) % 2:
        end = time.monotonic() + 0.05
        while time.monotonic() < end:
            pass
    else:
        time.sleep(0.05)
"""


class NoisyNeighbour:
    """A process that burns one CPU for `period_s`, rests for `period_s`, and so
    on, for as long as the `with` block runs.  It is stopped when the block
    ends however it ends (Ctrl-C included), and stops itself within 50 ms if
    the process that started it dies."""

    def __init__(self, period_s: float = 3.0):
        self.period_s = period_s
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> NoisyNeighbour:
        self.proc = subprocess.Popen([sys.executable, "-c", BURNER, str(self.period_s)],
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
        if self.proc:
            self.proc.wait()


# ---------------------------------------------------------------- real verdicts under load

REAL_PROFILES = ("experiments/aa-pageout.toml", "experiments/pageout-thp-modes.toml")
EXPECTED = {"aa-pageout": {("B", "A"): criteria.Verdict.NO_CHANGE},
            "pageout-thp-modes": {("thp=hugepage", "thp=nohugepage"): criteria.Verdict.REGRESSION}}


@dataclass
class RealResult:
    name: str
    plan: Plan
    exp_id: int
    result: runner.RunResult
    judgement: verdicts.Judgement

    def expected(self) -> list[str]:
        """What the report behind this profile expects, and whether it came."""
        out = []
        for (arm, base), want in EXPECTED.get(self.name, {}).items():
            got = {c.verdict for c in self.judgement.comparisons
                   if (c.arm, c.baseline) == (arm, base)}
            out.append(f"{self.name}: {arm} vs {base}: expected {want}, got "
                       f"{', '.join(sorted(got)) or 'nothing'}"
                       + ("" if got == {want} else "  <-- not as expected"))
        return out


def shrunk(path: Path, into: Path, **keys) -> Path:
    """A copy of profile `path` in `into` with top-level `keys` replaced (None: kept)."""
    data = tomllib.loads(path.read_text())
    data.update({k: v for k, v in keys.items() if v is not None})
    if data.get("max_repetitions", data["repetitions"]) < data["repetitions"]:
        data["max_repetitions"] = data["repetitions"]
    out = into / path.name
    out.write_text(f"# {path.name} as `make bench` ran it: {keys}\n" + tomli_w.dumps(data))
    return out


def real_verdicts(profiles: list[Path], results: Path, period_s: float = 3.0,
                  **overrides) -> list[RealResult]:
    """Run each profile (with `overrides` such as repetitions, max_repetitions,
    min_sample_ms) into `results` while a noisy neighbour runs."""
    out = console()
    say = plain(out)
    done = []
    store = Store(results)
    with tempfile.TemporaryDirectory() as tmp, NoisyNeighbour(period_s):
        for path in profiles:
            plan = load(shrunk(Path(path), Path(tmp), **overrides)
                        if any(v is not None for v in overrides.values()) else path)
            p = plan.profile

            def told(event: Event, p: Profile = p) -> None:
                if isinstance(event, Created):
                    out.print(f"{p.name}: experiment {event.ids[0]} in {store.dir}, "
                              f"{p.repetitions}..{p.rounds_at_most} rounds, "
                              f"noisy neighbour on/off every {period_s:g} s")
                elif isinstance(event, Message):
                    say(event.text)
            ran = driver.run_experiment(store, plan, driver.Here(TargetPool(False, say)),
                                        on_event=told)
            done.append(RealResult(p.name, ran.result.plan, ran.exp_id, ran.result,
                                   ran.result.judgement))
    return done


def print_real(found: list[RealResult]) -> None:
    from mmlab.report import terminal
    from mmlab.report.terminal import experiment
    out = console()
    for r in found:
        out.print(experiment.compare_table(
            r.plan, f"{r.name} under a noisy neighbour: {r.result.rounds} rounds "
                    f"({r.result.stopped})", r.judgement))
        for c in r.judgement.comparisons:
            out.print(terminal.escape(f"  {c.metric}: {c.arm} vs {c.baseline}: {c.verdict} "
                                      f"({c.method or '-'}, {c.stopped}): {c.reason[:120]}"))
        for line in r.expected():
            out.print(terminal.escape(line))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mmlab.bench",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=["all", "peer", "stability", "selftest", "verdicts",
                                           "agreement", "census", "guests", "startup",
                                           "calibration", "events"],
                        default="all")
    parser.add_argument("--guest", default="debian:6.12",
                        help="the guest kernel for stress-ng's agreement and the guests part "
                             "('none': host only)")
    parser.add_argument("--pairs", type=int, default=10,
                        help="agreement: interleaved pairs (pageout; half as many for stress-ng)")
    parser.add_argument("--calibration-guest", default=calibration.same_series_guest(),
                        help="calibration: the TCG guest of this machine's kernel series")
    parser.add_argument("--calibration-rounds", type=int, default=4,
                        help="calibration: paired rounds on each side")
    parser.add_argument("--experiments", type=int, default=2000,
                        help="simulated profiles per cell of the selftest")
    parser.add_argument("--seed", type=int, default=1, help="the selftest's seed")
    parser.add_argument("--results", type=Path, default=Path("mmlab-results/bench"),
                        help="store for the real verdicts")
    parser.add_argument("--repetitions", type=int, help="override the profiles' repetitions")
    parser.add_argument("--max-repetitions", type=int,
                        help="override the profiles' max_repetitions")
    parser.add_argument("--min-sample-ms", type=int, help="override the profiles' min_sample_ms")
    parser.add_argument("--period", type=float, default=3.0,
                        help="seconds the neighbour is on, then off")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    out = console()
    try:
        if args.part in ("all", "startup"):
            out.print(startup.table())
        if args.part in ("all", "peer"):
            if shutil.which("stress-ng"):
                out.print(mremap_table())
            else:
                out.print("stress-ng is not installed: the side-by-side part is skipped "
                          "(`make setup` installs it)")
        if args.part in ("all", "stability"):
            out.print(pageout_cv_table())
        if args.part in ("all", "agreement"):
            found = agreement.pageout(args.pairs) + agreement.stress_ng_host(
                max(3, args.pairs // 2))
            if args.guest != "none":
                found += agreement.stress_ng_guest(args.guest, max(3, args.pairs // 2))
            out.print(agreement.table(found))
        if args.part in ("all", "census"):
            out.print(census.table())
        if args.part in ("all", "guests") and args.guest != "none":
            out.print(guest_start.table(args.guest))
        if args.part in ("all", "events") and args.guest != "none":
            out.print(event_cost.table(args.guest))
        if args.part in ("all", "calibration"):
            rows = calibration.measure(args.results / "calibration", args.calibration_guest,
                                       args.calibration_rounds, plain(out))
            out.print(calibration.table(rows, args.calibration_guest, args.calibration_rounds))
        if args.part in ("all", "selftest"):
            selftest_report.print_report(args.experiments, args.seed)
        if args.part in ("all", "verdicts"):
            print_real(real_verdicts([REPO_ROOT / p for p in REAL_PROFILES], args.results,
                                     args.period, repetitions=args.repetitions,
                                     max_repetitions=args.max_repetitions,
                                     min_sample_ms=args.min_sample_ms))
    except MmlabError as exc:
        print(f"mmlab bench: {exc}", file=sys.stderr)
        sys.exit(2)
    except Interrupted:
        print("mmlab bench: interrupted; the neighbour is stopped and the trial in flight "
              "replanned", file=sys.stderr)
        sys.exit(130)


def _interrupt(_signo: int, _frame: object) -> None:
    raise Interrupted
