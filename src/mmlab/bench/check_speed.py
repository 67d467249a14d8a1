"""`python -m mmlab.bench.check_speed`: how long a patch check takes, as a
benchmark (not a test): a one-file patch against a kept base over the broad
mm suite, on counts, its incremental build included, and where the time
went.

It runs the command a user runs, `mmlab check PATCH --base BASE --suite
SUITE --results DIR --json`, the patch written out with a line of its own
in its message: a build's cache key is the patch's bytes, so its kernel is
built again, incrementally, on the kept base, each run.  The base must be
kept already (a first check of it, or `mmlab kernels build`, makes it):
the benchmark is of a check against a cached base (where it was not, the
base's build is a part of its own and the whole is said not to be that).

Where the time went is read from the command's own records, not guessed
from outside: make's seconds (the patched kernel's build record); the
experiments from their creation to their last trial's end, by what they
were for (the first looks, the confirmations, the bisection steps), the
seconds of experiments that ran at once (over a fleet's machines) counted
once; the attribution boots (from a confirmation's last trial to its last
attribution record, outside every experiment's run); the coverage's
counts of the base (as the check times them); the trials' guests (how
many were restored from a saved boot or booted, and a bound on what
starting them cost: no trial is shorter than its guest's start and
end); the rest (mmlab's start, copying and patching the base
tree, judging, evidence, the report) is what remains.  The load average is
sampled through the run: a figure taken beside other work says so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from mmlab.bench import fleet, services
from mmlab.check.variants import SUITE  # the broad suite, a check's default
from mmlab.kernels import images, kbuild
from mmlab.report.terminal import console
from mmlab.store import Store
from mmlab.store.backend import is_url
from mmlab.workloads.build import REPO_ROOT

PATCH = REPO_ROOT / "experiments/patches/seed003-zap-set-referenced-6.12.patch"
GOAL_S = 20 * 60            # the goal on this 2-core machine (docs/check.md)
WHY = re.compile(r"^check \S+ (first|confirm|narrow) ")
LOAD_EVERY_S = 10
FIGURES = REPO_ROOT / "mmlab-results/bench/check-speed"   # a run's folder by default


@dataclass
class Spent:
    """Where one check's seconds went."""
    total: float
    make: float | None = None
    base_make: float | None = None     # the base's make, where the check built it
    before: float = 0.0                # from the start to the first experiment
    phases: dict[str, float] = field(default_factory=dict)     # first, confirm, narrow
    experiments: dict[str, int] = field(default_factory=dict)
    trials: dict[str, int] = field(default_factory=dict)
    attribution: float = 0.0
    coverage: float = 0.0              # the base counted by function (the check's own figure)
    trial_walls: list[float] = field(default_factory=list)    # each trial's seconds
    starts: dict[str, int] = field(default_factory=dict)   # booted, restored

    @property
    def rest(self) -> float:
        return (self.total - self.before - sum(self.phases.values()) - self.attribution
                - self.coverage)


def fresh_copy(patch: Path, into: Path) -> Path:
    """`patch` with a header line of this run's own: the same diff, new
    bytes, so its kernel is built again on the kept base.  It goes in
    before the subject, where a header starts (after it, a subject folded
    over lines would lose its rest to the new header)."""
    lines = patch.read_text().splitlines(keepends=True)
    at = next((i for i, line in enumerate(lines) if line.startswith("Subject:")), 0)
    lines.insert(at, f"X-mmlab-bench: check_speed {time.time_ns()}\n")
    out = into / patch.name
    out.write_text("".join(lines))
    return out


def run_check(argv: list[str]) -> tuple[subprocess.CompletedProcess, float, list[float]]:
    """The command to its end (its progress on stderr as it goes), when it
    started (epoch seconds) and the 1-minute load average every
    LOAD_EVERY_S."""
    loads, start = [os.getloadavg()[0]], time.time()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(argv, stdout=out, text=True)
        while proc.poll() is None:
            try:
                proc.wait(LOAD_EVERY_S)
            except subprocess.TimeoutExpired:
                loads.append(os.getloadavg()[0])
        out.seek(0)
        return subprocess.CompletedProcess(argv, proc.returncode, out.read()), start, loads


@contextlib.contextmanager
def local_fleet(workers: int) -> Iterator[tuple[str, list[str]]]:
    """A fleet on this machine for one check: a private PostgreSQL store and
    Redis broker (services.py) and `workers` real workers (`mmlab worker`,
    one queue each, concurrency 1), which read this machine's kernel cache
    and so boot the kernels the check builds; the store's URL and the
    machines' names, everything stopped and removed at the end."""
    names = [f"local{i + 1}" for i in range(workers)]
    with services.PostgresCluster(max_connections=3 * workers + 20) as pg, \
            services.Redis() as redis, tempfile.TemporaryDirectory() as logs:
        url = pg.url("check")
        procs = fleet.start_workers(names, url, redis.url, Path(logs),
                                    [sys.executable, "-m", "mmlab.cli", "worker", "--name"])
        try:
            fleet.wait_for(names, url, redis.url, procs)
            yield url, names
        finally:
            fleet.stop_workers(procs)


def spent(store: Store, record: dict, start: float, end: float) -> Spent:
    """The check's time by part, from its kernels' and experiments' records.
    A part is the time some experiment of it ran (from its creation to its
    last trial's end), each second once: over a fleet's machines a check
    runs its first looks at once, then its confirmations, so adding their
    spans would count the same seconds several times.  The attribution is
    what a confirmation's or bisection step's records took after its
    trials, outside every experiment's span; the coverage's counts of the
    base, stored with the first looks at the check's end, are timed by the
    check itself."""
    found = Spent(end - start, images.get(record["patched"]["name"]).details.get("make_s"),
                  base_built(record, start))
    spans: dict[str, list[tuple[float, float]]] = {}
    attributing = []
    for exp_id in record["experiments"]:
        m = WHY.match(store.plan(exp_id).profile.derived or "")
        why = m.group(1) if m else "other"
        created = float(store.experiment(exp_id)["created"])
        ran = [(t.started, t.ended) for t in store.trials(exp_id) if t.started and t.ended]
        measured = max((e for _, e in ran), default=created)
        spans.setdefault(why, []).append((created, measured))
        found.experiments[why] = found.experiments.get(why, 0) + 1
        found.trials[why] = found.trials.get(why, 0) + len(ran)
        found.trial_walls += [e - b for b, e in ran]
        if why != "first" and (last := store.attributed_at(exp_id)) is not None:
            attributing.append((measured, last))
        for trial in store.measurements(exp_id).trials:
            _started(found, trial.samples[0].state if trial.samples else {})
    if spans:
        found.before = min(a for span in spans.values() for a, _ in span) - start
    taken: list[tuple[float, float]] = []
    for why, span in spans.items():
        found.phases[why] = _covered(span, taken)
        taken += span
    found.attribution = _covered(attributing, taken)
    found.coverage = float((record.get("coverage") or {}).get("seconds") or 0.0)
    return found


def base_built(record: dict, start: float) -> float | None:
    """The base's make seconds where the check built its tree (it was not
    kept when the check began), else None: the benchmark is of a check
    against a kept base, and a base's build would pass for mmlab's start."""
    base = images.get(record["base"]["name"]).details
    outputs = kbuild.base_dir(base["build_key"]) / "outputs" if "build_key" in base else None
    if outputs is None or not outputs.is_file() or outputs.stat().st_mtime < start:
        return None
    return float(base.get("make_s") or 0.0)


def _covered(spans: list[tuple[float, float]], taken: list[tuple[float, float]]) -> float:
    """The seconds inside some of `spans` and inside none of `taken`."""
    held = _merged(taken)
    return sum(b - a - sum(max(0.0, min(b, d) - max(a, c)) for c, d in held)
               for a, b in _merged(spans))


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """`spans` as the fewest disjoint spans covering the same seconds."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        elif b > a:
            out.append((a, b))
    return out


def _started(found: Spent, state: dict) -> None:
    """How one trial's guest started, from its first sample's labels."""
    if "guest_start" in state:
        how = str(state["guest_start"])
        found.starts[how] = found.starts.get(how, 0) + 1


def table(s: Spent, record: dict, loads: list[float], title: str, goal: bool) -> Table:
    """The parts as a table; `goal`: over the broad suite, whose goal it says."""
    t = Table(title=title)
    for col in ("part", "seconds", "share", "what"):
        t.add_column(col, justify="left" if col in ("part", "what") else "right")

    def row(part: str, secs: float | None, what: str) -> None:
        t.add_row(part, "-" if secs is None else f"{secs:,.0f}",
                  "-" if secs is None else f"{secs / s.total:.0%}", what)
    if s.base_make is not None:
        row("the base's build (it was not kept)", s.base_make, "its make")
    row("the incremental build (make)", s.make, "the patched kernel on a copy of the kept base")
    row("before the first trial, beside make", s.before - (s.make or 0.0) - (s.base_make or 0.0),
        "mmlab's start, the series read and checked, the base tree copied and patched, "
        "the kernel stored")
    for why, label in (("first", "first looks"), ("confirm", "confirmations"),
                       ("narrow", "bisection steps")):
        if why in s.phases:
            row(label, s.phases[why], f"{s.experiments[why]} experiment(s), {s.trials[why]} "
                                      "trial(s)")
    row("attribution", s.attribution, f"{len(record['changes'])} confirmed change(s) explained")
    row("coverage (the base counted by function)", s.coverage,
        "which changed functions the paths ran")
    row("the rest", s.rest, "judging between the experiments, the evidence, the report")
    row("whole check", s.total, "not a check against a kept base: its base was built in it"
        if s.base_make is not None else f"the broad suite's goal {GOAL_S // 60} min: "
        f"{'met' if s.total <= GOAL_S else 'NOT met'}" if goal else "")
    t.caption = guests(s) + (f"; 1-min load average {min(loads):.1f} to {max(loads):.1f}, "
                             f"mean {sum(loads) / len(loads):.1f}")
    return t


def guests(s: Spent) -> str:
    """The trials' guests: how they started, and a bound on what starting
    and ending them cost (no trial costs less than its guest's start and
    end, so the shortest trial bounds it)."""
    walls = sorted(s.trial_walls) or [0.0]
    starts = ", ".join(f"{n} {how}" for how, n in sorted(s.starts.items()))
    whole = max(sum(walls), 1e-9)
    return (f"{len(s.trial_walls)} trials ({starts}), {whole:,.0f} guest-s, shortest "
            f"{walls[0]:.1f} s, median {walls[len(walls) // 2]:.1f} s: guest starts and ends "
            f"at most {len(s.trial_walls) * walls[0] / whole:.0%} of the trials' time")


def outcome(record: dict) -> str:
    """Paths checked, candidates at the first look, confirmed changes."""
    candidates = len(record["changes"]) + len(record["unconfirmed"])
    return (f"{record['paths']} path(s) of {len(record['profiles'])} profile(s); "
            f"{candidates} candidate(s) at the first look, {len(record['changes'])} "
            f"confirmed, {len(record['unconfirmed'])} not; {len(record['failed'])} failed")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mmlab.bench.check_speed",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--patch", type=Path, default=PATCH, help="a one-file patch")
    parser.add_argument("--base", default="debian-source:6.12", help="a base already kept")
    parser.add_argument("--config", default="tiny",
                        help="the check's --config: that of the kept base (tiny: the fastest "
                             "to build, and the one kept here)")
    parser.add_argument("--suite", type=Path, default=SUITE)
    parser.add_argument("--results", default=None,
                        help="the check's store (default: a new folder under "
                             "mmlab-results/bench/check-speed)")
    parser.add_argument("--check-option", action="append", default=[], metavar="OPTION",
                        help="passed on to mmlab check, repeatable (e.g. "
                             "--check-option=--machines --check-option=a,b)")
    parser.add_argument("--workers", type=int, default=0,
                        help="spread the check over a fleet of this many workers started "
                             "here (a private store and broker; 0: no fleet)")
    args = parser.parse_args(argv)
    if not args.patch.is_file():
        sys.exit(f"mmlab bench: --patch {args.patch}: no such file")
    if args.workers < 0 or (args.workers and (args.results or "--machines" in args.check_option)):
        sys.exit(f"mmlab bench: --workers {args.workers}: a count of local workers, "
                 "without --results or --machines (the fleet is made here)")
    with local_fleet(args.workers) if args.workers else contextlib.nullcontext() as made:
        if made:
            args.results = made[0]
            args.check_option += ["--machines", ",".join(made[1])]
        measure(args)


def measure(args: argparse.Namespace) -> None:
    """One check, timed, and where its time went."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results = args.results or str(FIGURES / stamp)
    # A fleet's store is a URL with its password: the figures go to a
    # folder here, and neither they nor the screen name the URL.
    figures, shown = ((FIGURES / stamp, "the fleet's store") if is_url(results)
                      else (Path(results), results))
    with tempfile.TemporaryDirectory(prefix="mmlab-check-speed-") as scratch:
        patch = fresh_copy(args.patch, Path(scratch))
        argv_ = [sys.executable, "-m", "mmlab.cli", "check", str(patch), "--base", args.base,
                 "--config", args.config, "--suite", str(args.suite), "--results", results,
                 "--json", *args.check_option]
        done, start, loads = run_check(argv_)
        end = time.time()
    if done.returncode not in (0, 1):
        sys.exit(f"mmlab bench: mmlab check exited {done.returncode} (its error above)")
    record = json.loads(done.stdout)
    s = spent(Store(results, create=False, read_only=True), record, start, end)
    out = console()
    out.print(table(s, record, loads, f"mmlab check {args.patch.name} --base {args.base} "
                                      f"--suite {args.suite.name}",
                    args.suite.resolve() == SUITE))
    out.print(outcome(record) + f"; exit status {done.returncode}; results in {shown}",
              markup=False, highlight=False)
    keep(figures, done, [shown if a == results else a for a in argv_], s, loads, record)


def keep(figures: Path, done: subprocess.CompletedProcess, argv: list[str], s: Spent,
         loads: list[float], record: dict) -> None:
    """The check's JSON and these figures, for a later look or the docs."""
    figures.mkdir(parents=True, exist_ok=True)
    (figures / "check.json").write_text(done.stdout)
    (figures / "check-speed.json").write_text(json.dumps(
        {"argv": argv, "exit": done.returncode, "seconds": s.total, "loads": loads,
         "spent": {**vars(s), "rest": s.rest}, "guests": guests(s),
         "outcome": outcome(record)}, indent=1) + "\n")


if __name__ == "__main__":
    main()
