"""`make bench-fleet`: the fleet's own cost, measured on this machine.

A private PostgreSQL and Redis (services.py), N workers started as local
processes, each the worker of one named machine with its own queue and one
pool process (concurrency 1, as on a real machine), and one fleet run of
T trials spread evenly over them.  Every trial only sleeps (SleepTarget: the
measured sleep is its one metric, arm B sleeping 10 % longer than A so each
machine's verdict has a change to find), so what is left of the wall time is
the fleet's: broker, worker, store and coordinator.

Printed: scheduling overhead per trial (between one trial's end and the next
one's start on a machine, and inside a trial beyond its sleep), the store's
write rate (commits and sample rows per second, overall and at the busiest
second), the coordinator's CPU per trial, and where the time went.  Nothing
is asserted; figures are what this machine gave.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from mmlab.bench import services
from mmlab.errors import Interrupted, MmlabError
from mmlab.experiment.plan import Arm, Plan
from mmlab.experiment.profile import ArmEntry, Profile
from mmlab.experiment.schedule import schedule
from mmlab.fleet import coordinator, engine, registry, summary, worker
from mmlab.report.terminal import console
from mmlab.report.terminal import fleet as fleet_tables
from mmlab.run.events import Event, Message, OnEvent, TrialStarting
from mmlab.store import Store
from mmlab.targets import LocalTarget, TrialResult
from mmlab.workloads import Metric, Param, Workload
from mmlab.workloads.samples import Sample

SLEEP = Workload(name="sleep", seed="-", summary="only sleeps: the fleet benchmark's trials",
                 params=(Param("ms", "float", "100", "how long a trial sleeps"),),
                 metrics=(Metric("slept_ms", "ms", "lower", "the sleep, measured"),),
                 mm_paths=(), vmstat=(), tracepoints=(), host_settings=())
RUSAGE = {"user_s": 0.0, "sys_s": 0.0, "minflt": 0.0, "majflt": 0.0, "nvcsw": 0.0,
          "nivcsw": 0.0}


class SleepTarget(LocalTarget):
    """A trial that sleeps the arm's `ms` and measures how long it slept."""
    name = "sleep"

    def check(self, plan: Plan) -> None:
        pass

    def run_trial(self, arm: Arm, plan: Plan) -> TrialResult:
        start = time.perf_counter()
        time.sleep(float(arm.params["ms"]) / 1000)
        slept = (time.perf_counter() - start) * 1000
        sample = Sample(workload="sleep", sample=0, mmwork_version="none (sleep only)",
                        params=dict(arm.params), metrics={"slept_ms": slept}, counts={},
                        rusage=RUSAGE, vmstat_delta={}, state={}, errors={})
        return TrialResult([sample], {"target": "sleep", "pid": os.getpid()})

    def attribute(self, arm: Arm, plan: Plan) -> dict[str, dict]:
        return {}


def sleep_plan(rounds: int, ms: float) -> Plan:
    """Arms A (ms) and B (1.1 x ms), `rounds` interleaved rounds, one look."""
    profile = Profile(name="bench-fleet", workload="sleep", arms=[ArmEntry(name="A"),
                                                                   ArmEntry(name="B")],
                      repetitions=rounds, metrics=["slept_ms"], baseline="A", seed=1)
    arms = [Arm(name="A", values={}, params={"ms": ms}),
            Arm(name="B", values={}, params={"ms": round(ms * 1.1, 3)})]
    return Plan(profile=profile, text="# make bench-fleet: sleep-only trials\n",
                path="<bench-fleet>", workload=SLEEP, arms=arms,
                order=schedule(["A", "B"], rounds, 1))


SLEEPER = [sys.executable, "-m", "mmlab.bench.fleet", "--worker"]   # this benchmark's worker


def start_workers(names: list[str], results: str, broker: str, logs: Path,
                  command: list[str] = SLEEPER) -> list[subprocess.Popen]:
    """A worker process per name: `command` then the name, the store and the
    broker; each in a session of its own, its output in `logs`."""
    return [subprocess.Popen([*command, name, "--results", results, "--broker", broker],
                             stdin=subprocess.DEVNULL, stdout=open(logs / f"{name}.log", "w"),
                             stderr=subprocess.STDOUT, start_new_session=True)
            for name in names]


def wait_for(names: list[str], results: str, broker: str, procs: list[subprocess.Popen],
             timeout: float = 600) -> float:
    """Until every worker is registered and answers; returns the seconds it took."""
    start = time.monotonic()
    store, celery = Store(results), engine.app(broker)
    try:
        while time.monotonic() - start < timeout:
            dead = [n for n, p in zip(names, procs) if p.poll() is not None]
            if dead:
                raise MmlabError(f"worker {dead[0]} exited while starting")
            known = registry.machines(store)
            if all(n in known for n in names):
                nodes = {known[n].node for n in names}
                if nodes <= set(engine.active(celery)):
                    return time.monotonic() - start
            time.sleep(1)
    finally:
        store.close()
    raise MmlabError(f"workers not all answering after {timeout:.0f} s")


def stop_workers(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def measure(store: Store, exp_ids: list[int], wall_s: float, ms: float) -> list[tuple[str, str]]:
    """The figures, from what the store holds."""
    gaps, inside, per_machine, ends = [], [], [], []
    samples = 0
    for exp_id in exp_ids:
        # (started, ended, position) of each done trial, by start
        spans = sorted(((t.started, t.ended, t.position) for t in store.trials(exp_id)
                        if t.status == "done" and t.started is not None and t.ended is not None),
                       key=lambda span: span[0])
        slept = [v / 1000 for ts in store.measurements(exp_id).trials for s in ts.samples
                 if (v := s.metrics["slept_ms"]) is not None]
        samples += len(slept)
        gaps += [b_start - a_end for (_, a_end, _), (b_start, _, _) in zip(spans, spans[1:])]
        inside += [(end - start) - s for (start, end, _), s in
                   zip(sorted(spans, key=lambda span: span[2]), slept)]
        busy = spans[-1][1] - spans[0][0]
        per_machine.append((busy - sum(slept)) / len(spans))
        ends += [end for _, end, _ in spans]
    done = len(ends)
    ends.sort()
    busiest = max(bisect.bisect_left(ends, e + 1) - i for i, e in enumerate(ends))
    ideal = max(len(store.trials(e)) for e in exp_ids) * ms * 1.05 / 1000
    return [
        ("trials done", f"{done} of {sum(len(store.trials(e)) for e in exp_ids)}"),
        ("wall time", f"{wall_s:.1f} s for the run (sleep alone: {ideal:.1f} s per machine)"),
        ("throughput", f"{done / wall_s:.1f} trials/s = {done / wall_s * 3600:,.0f} trials/hour"),
        ("overhead per trial, per machine", f"{statistics.median(per_machine) * 1000:.1f} ms "
         f"median over machines (its wall time minus its sleeps, per trial)"),
        ("  between trials on a machine", spread(gaps) + " (message, claim, plan read)"),
        ("  inside a trial beyond its sleep", spread(inside) + " (target, commit)"),
        ("store writes", f"{2 * done / wall_s:.1f} commits/s (a claim and a result per trial), "
         f"{samples / wall_s:.1f} sample rows/s; busiest second: {busiest} results "
         f"({2 * busiest} commits)"),
    ]


def cpu_split(workers: list[subprocess.Popen], postmaster: int, redis: int) -> dict[str, float]:
    """CPU seconds so far of the workers (each one's process group), the
    PostgreSQL server (the postmaster counts the backends it reaped), Redis
    and this process (the coordinator)."""
    groups = {p.pid for p in workers}
    found = {"workers": 0.0, "PostgreSQL": 0.0, "Redis": 0.0}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, pgrp, ppid = int(stat.parent.name), int(fields[2]), int(fields[1])
        ticks = sum(map(int, fields[11:13]))
        if pgrp in groups:
            found["workers"] += ticks
        elif pid == postmaster:
            found["PostgreSQL"] += ticks + sum(map(int, fields[13:15]))
        elif ppid == postmaster:
            found["PostgreSQL"] += ticks
        elif pid == redis:
            found["Redis"] += ticks
    spent = os.times()
    return {**{k: v / os.sysconf("SC_CLK_TCK") for k, v in found.items()},
            "coordinator": spent.user + spent.system}


def spread(seconds: list[float]) -> str:
    return (f"{statistics.median(seconds) * 1000:.1f} ms median, "
            f"{quantile(seconds, 0.95) * 1000:.1f} ms p95")


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run_bench(machines: int, trials: int, ms: float, keep_logs: Path | None) -> None:
    out = console()
    names = [f"m{i:02d}" for i in range(machines)]
    rounds = max(3, trials // machines // 2)
    with services.PostgresCluster(max_connections=3 * machines + 20) as pg, \
            services.Redis() as redis, tempfile.TemporaryDirectory() as tmp:
        logs = keep_logs or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        url = pg.url("bench")
        out.print(f"PostgreSQL {url}, Redis {redis.url}; starting {machines} workers "
                  f"(logs in {logs})")
        procs = start_workers(names, url, redis.url, logs)
        try:
            took = wait_for(names, url, redis.url, procs)
            out.print(f"{machines} workers registered and answering after {took:.0f} s")
            store = Store(url)
            ids = coordinator.create(store, sleep_plan(rounds, ms), names, False)
            before = cpu_split(procs, pg.pid(), redis.pid())
            start = time.monotonic()
            coordinator.run(url, ids, False, True, _progress(out, machines * rounds * 2))
            wall = time.monotonic() - start
            after = cpu_split(procs, pg.pid(), redis.pid())
            rows = measure(store, ids, wall, ms)
            n = machines * rounds * 2
            rows.append(("CPU per trial", ", ".join(
                f"{what} {(after[what] - before[what]) / n * 1000:.2f} ms" for what in after)
                + f" ({machines} machine threads in the coordinator, polling every "
                  f"{coordinator.POLL_S:g} s)"))
            found = summary.summarize(store, ids)
        finally:
            stop_workers(procs)
    out.print(f"[bold]fleet benchmark[/bold]: {machines} workers (one process each plus its "
              f"pool process, concurrency 1, one queue each) x {rounds * 2} trials of "
              f"{ms:g}/{ms * 1.1:g} ms sleeps, on {os.cpu_count()} CPUs")
    for what, value in rows:
        out.print(f"  {what:<34} {value}")
    for r in found.rows:
        out.print(f"  verdicts: {r.metric} {r.arm} vs {r.baseline}: reproduced on "
                  f"{len(r.reproduced_on)} of {len(r.by_machine)} machines")
    out.print(fleet_tables.summary_table(found) if machines <= 4 else "")


def _progress(out, total: int) -> OnEvent:
    """A line every 10 % of the trials started, and the coordinator's
    messages (heard from every machine's thread)."""
    started = itertools.count(1)
    lock = threading.Lock()

    def on_event(event: Event) -> None:
        if isinstance(event, Message):
            out.print(event.text)
        if not isinstance(event, TrialStarting):
            return
        with lock:
            count = next(started)
            if count % max(1, total // 10) == 0:
                out.print(f"  {count} of {total} trials started")
    return on_event


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mmlab.bench.fleet",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--machines", type=int, default=50, help="workers, one queue each")
    parser.add_argument("--trials", type=int, default=10_000, help="trials over all machines")
    parser.add_argument("--ms", type=float, default=100, help="arm A's sleep per trial")
    parser.add_argument("--logs", type=Path, help="keep the workers' logs here")
    parser.add_argument("--worker", metavar="NAME", help=argparse.SUPPRESS)
    parser.add_argument("--results", help=argparse.SUPPRESS)
    parser.add_argument("--broker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        if args.worker:        # one of the benchmark's own workers: sleeps instead of mmwork
            worker.serve(args.worker, args.results, args.broker,
                         make_target=lambda allow, arm: SleepTarget())
        else:
            signal.signal(signal.SIGTERM, _interrupt)
            run_bench(args.machines, args.trials, args.ms, args.logs)
    except MmlabError as exc:
        print(f"mmlab bench-fleet: {exc}", file=sys.stderr)
        sys.exit(2)
    except Interrupted:
        print("mmlab bench-fleet: interrupted; workers and services stopped", file=sys.stderr)
        sys.exit(130)


def _interrupt(_signo: int, _frame: object) -> None:
    raise Interrupted


if __name__ == "__main__":
    main()
