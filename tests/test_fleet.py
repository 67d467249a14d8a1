"""A lab of many machines on this one: a private PostgreSQL and Redis from
Debian's packages, started here and stopped afterwards.

The PostgreSQL store keeps the SQLite store's guarantees (same plan, same
trials, same verdicts; a trial claimed once by concurrent writers; a claim
lost to a re-queue counts nothing) and `store copy` moves a lab directory
into it and back.  End to end: a profile over two workers (two `mmlab worker`
processes with different names) running real mmwork trials, a worker killed
in the middle of a trial (re-queued, never lost or counted twice), the run
interrupted and resumed, verdicts per machine and the fleet summary."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mmlab.bench import fleet as fleet_bench
from mmlab.bench import services
from mmlab.errors import MmlabError
from mmlab.experiment.plan import parse
from mmlab.fleet import coordinator, engine, queue, registry, summary
from mmlab.fleet import worker as fleet_worker
from mmlab.judge import measurements, verdicts
from mmlab.judge.criteria import Verdict
from mmlab.kernels import images
from mmlab.report.terminal import fleet as fleet_tables
from mmlab.run import runner
from mmlab.run.events import Message
from mmlab.store import Store
from mmlab.targets import baremetal

from . import box
from .conftest import MMLAB, mmlab
from .fake_target import FakeTarget, fake_pool
from .test_baremetal import (
    KERNELS,
    SIMULATED_PROFILE,
    TWO_KERNELS,
    PlayedMachine,
    framed,
    sample_lines,
)

FAKE = """\
name = "fleet-fake"
workload = "pageout-refault"
repetitions = 6
metrics = ["cycle_ns_per_page"]
baseline = "A"
seed = 3

[params]
mapping-kb = 1024

[[arms]]
name = "A"

[[arms]]
name = "B"
"""

# Real trials, cheap and long enough (about half a second) to be killed in.
THP = """\
name = "fleet-thp"
workload = "pageout-refault"
repetitions = 8         # 6 paired rounds give p >= 0.031: one disturbed round undoes it
min_sample_ms = 300
metrics = ["cycle_ns_per_page"]
baseline = { thp = "nohugepage" }
seed = 5

[params]
mapping-kb = 4096

[matrix]
thp = ["hugepage", "nohugepage"]
"""


@pytest.fixture(scope="module")
def servers():
    with services.PostgresCluster() as pg, services.Redis() as redis:
        yield pg, redis


def fresh_db(servers, name: str) -> str:
    return servers[0].url(name)


def run_fake(results: str | Path, fake: FakeTarget) -> tuple[Store, int]:
    plan = parse(FAKE, "fleet-fake.toml")
    store = Store(results)
    exp_id = store.create_experiment(plan)
    runner.run(store, exp_id, plan, fake_pool(fake))
    return store, exp_id


def contents(store: Store, exp_id: int) -> tuple:
    """What an experiment holds, without ids and times."""
    trials = [(t.arm, t.position, t.round, t.status, t.error) for t in store.trials(exp_id)]
    samples = [(t.arm, t.round, [s.model_dump() for s in t.samples])
               for t in store.measurements(exp_id).trials]
    return store.plan(exp_id).model_dump(), trials, samples


def test_a_lab_directory_needs_nothing_of_the_fleet(tmp_path):
    code = ("import sys; from mmlab import cli, store; from mmlab.run import runner; store.Store(sys.argv[1]); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('celery', 'kombu', 'billiard', 'redis', 'psycopg') or m.startswith('mmlab.fleet')))")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "r")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_postgresql_store_holds_what_sqlite_holds_and_resumes(servers, tmp_path):
    lite, lite_id = run_fake(tmp_path / "r", FakeTarget({"B": 1.3}, seed=7))
    pg, pg_id = run_fake(fresh_db(servers, "same"), FakeTarget({"B": 1.3}, seed=7))
    assert contents(pg, pg_id) == contents(lite, lite_id)
    judged = [verdicts.judge(s.plan(e), s.measurements(e)).comparisons
              for s, e in ((lite, lite_id), (pg, pg_id))]
    assert [json.dumps(c.as_dict()) for c in judged[0]] == \
        [json.dumps(c.as_dict()) for c in judged[1]]
    assert judged[1][0].verdict == "regression"
    # a process killed mid-trial leaves its trial running; resume runs it once
    plan = pg.plan(pg_id)
    again = pg.create_experiment(plan)
    first = pg.trials(again)[0]
    assert pg.start_trial(first.id) is not None
    runner.run(pg, again, plan, fake_pool(FakeTarget()))
    assert [t.status for t in pg.trials(again)] == ["done"] * 12
    assert sum(len(t.samples) for t in pg.measurements(again).trials) == 12


def test_concurrent_writers_claim_each_trial_once_and_a_lost_claim_counts_nothing(servers):
    url = fresh_db(servers, "writers")
    plan = parse(FAKE.replace("repetitions = 6", "repetitions = 30"), "w.toml")
    exp_id = Store(url).create_experiment(plan)
    sample = fake_pool(FakeTarget()).target(plan.arms[0]).run_trial(plan.arms[0], plan).samples
    claimed: list[int] = []

    def writer() -> None:
        store = Store(url)
        for t in store.trials(exp_id):
            claim = store.start_trial(t.id)
            if claim is not None:
                assert store.finish_trial(t.id, sample, {"writer": threading.get_ident()}, claim)
                claimed.append(t.id)
        store.close()

    threads = [threading.Thread(target=writer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store = Store(url)
    assert sorted(claimed) == sorted(t.id for t in store.trials(exp_id))     # each once
    assert sum(len(t.samples) for t in store.measurements(exp_id).trials) == 60
    # a claim lost to a re-queue: the slow worker's late result is refused whole
    other = store.create_experiment(plan)
    t = store.trials(other)[0]
    stale = store.start_trial(t.id)
    assert store.replan_trial(t.id)
    fresh = store.start_trial(t.id)
    assert not store.finish_trial(t.id, sample, {}, stale)
    assert not store.fail_trial(t.id, "late", None, stale)
    assert store.finish_trial(t.id, sample, {}, fresh)
    assert len(store.measurements(other).trials[0].samples) == 1
    assert not store.replan_trial(t.id)                 # a finished trial stays finished


def test_store_copy_moves_a_lab_directory_into_postgresql_and_back(servers, tmp_path):
    lite, exp_id = run_fake(tmp_path / "lab", FakeTarget({"B": 0.8}, seed=2))
    url = fresh_db(servers, "copy")
    proc = mmlab("store", "copy", str(tmp_path / "lab"), url)
    assert proc.returncode == 0, proc.stderr
    assert f"experiment {exp_id} -> " in proc.stdout
    assert contents(Store(url), exp_id) == contents(lite, exp_id)          # same id
    again = mmlab("store", "copy", str(tmp_path / "lab"), url)
    assert "skipped" in again.stdout and len(Store(url).experiments()) == 1
    back = mmlab("store", "copy", url, str(tmp_path / "back"))
    assert back.returncode == 0, back.stderr
    assert contents(Store(tmp_path / "back"), exp_id) == contents(lite, exp_id)
    shown = mmlab("compare", str(exp_id), "--results", url, "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)[0]["verdict"] == "improvement"


def test_fleet_commands_refuse_clearly(servers, tmp_path):
    profile = tmp_path / "p.toml"
    profile.write_text(FAKE)
    lab = mmlab("experiment", "run", str(profile), "--machines", "a", "--results",
                str(tmp_path / "r"))
    assert lab.returncode == 2 and "postgresql://" in lab.stderr
    unknown = mmlab("experiment", "run", str(profile), "--machines", "nosuch", "--results",
                    fresh_db(servers, "refuse"))
    assert unknown.returncode == 2 and "machine nosuch: no worker has registered" in unknown.stderr
    worker = mmlab("worker", "--name", "x", "--results", str(tmp_path / "r"))
    assert worker.returncode == 2 and "postgresql://" in worker.stderr


# ---------------------------------------------------------------- two workers, end to end

def start_worker(name: str, url: str, broker: str, tmp_path: Path,
                 *options: str) -> subprocess.Popen:
    """`mmlab worker --name NAME` as a machine of its own (its own state dir)."""
    env = {**os.environ, "MMLAB_STATE_DIR": str(tmp_path / f"state-{name}")}
    return subprocess.Popen([*MMLAB, "worker", "--name", name, "--results", url, "--broker",
                             broker, *options], env=env,
                            stdout=open(tmp_path / f"{name}.log", "a"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def wait_until(what: str, check, timeout: float = 60, every: float = 0.02):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"not within {timeout} s: {what}")


def answering(url: str, celery, names: list[str]) -> bool:
    known = registry.machines(Store(url))
    return all(n in known for n in names) and \
        {known[n].node for n in names} <= set(engine.active(celery))


def trial_of(store: Store, exp_id: int, trial_id: int):
    return next(t for t in store.trials(exp_id) if t.id == trial_id)


@pytest.fixture
def workers():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test_trials_whose_messages_are_lost_are_sent_again_and_run_once(servers, tmp_path,
                                                                    workers):
    """The broker loses the machine's queue mid-run (as a Redis restarted
    without its append-only file would): the planned trials are sent again."""
    url, broker = fresh_db(servers, "lost"), servers[1].url
    workers += fleet_bench.start_workers(["s"], url, broker, tmp_path)   # sleeps, no mmwork
    fleet_bench.wait_for(["s"], url, broker, workers)
    store = Store(url)
    # Trials of 0.6 s: the queue still holds most of them when the first is
    # seen running, even on a busy machine (at 0.15 s a slow look found 4 gone)
    (exp_id,) = coordinator.create(store, fleet_bench.sleep_plan(4, 600), ["s"], False)
    said: list[str] = []
    run = threading.Thread(target=coordinator.run, args=(
        url, [exp_id], False, True,
        lambda e: said.append(e.text) if isinstance(e, Message) else None))
    run.start()
    wait_until("a trial running", lambda: store.trials(exp_id, status="running"))
    with engine.app(broker).connection_for_write() as conn:
        lost = conn.default_channel.queue_purge(queue("s"))
    assert 1 <= lost <= 7
    run.join(120)
    assert not run.is_alive()
    assert [t.status for t in store.trials(exp_id)] == ["done"] * 8
    assert [len(t.samples) for t in store.measurements(exp_id).trials] == [1] * 8
    assert said == [f"s: {lost} planned trial(s) had no message in its queue; sent again"]


def test_two_workers_run_a_profile_survive_a_killed_worker_and_resume(servers, tmp_path,
                                                                      workers):
    url, broker = fresh_db(servers, "fleet"), servers[1].url
    celery = engine.app(broker)
    workers += [start_worker(n, url, broker, tmp_path) for n in ("a", "b")]
    wait_until("both workers answer", lambda: answering(url, celery, ["a", "b"]), every=0.5)
    profile = tmp_path / "thp.toml"
    profile.write_text(THP)
    run = subprocess.Popen([*MMLAB, "experiment", "run", str(profile), "--machines", "a,b",
                            "--results", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env={**os.environ, "MMLAB_FLEET_LOST_S": "4"})
    store = Store(url)
    exp_a, exp_b = wait_until("the fleet's experiments", lambda: [
        r["id"] for r in store.experiments()] if len(store.experiments()) == 2 else None)
    assert [store.plan(e).machine for e in (exp_a, exp_b)] == ["a", "b"]
    assert coordinator.members(store, exp_b) == [exp_a, exp_b]

    # b is killed in the middle of a trial: the trial goes back to the plan
    killed = wait_until("a trial running on b", lambda: next(
        (t for t in store.trials(exp_b) if t.status == "running"), None))
    os.killpg(workers[1].pid, signal.SIGKILL)
    workers[1].wait()
    wait_until("the killed trial re-queued", lambda: trial_of(
        store, exp_b, killed.id).status == "planned", timeout=30, every=0.2)
    assert all(t.position != killed.position for t in store.measurements(exp_b).trials)

    # b comes back, takes the re-queued trial; the run is interrupted and resumed
    workers[1] = start_worker("b", url, broker, tmp_path)
    wait_until("b answers again", lambda: answering(url, celery, ["b"]), every=0.5)
    wait_until("b has run the re-queued trial", lambda: trial_of(
        store, exp_b, killed.id).status == "done", timeout=60, every=0.2)
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=60)
    # 0, or killed by the signal's default action while Python exits: it had
    # just finished (its last line is the experiment ID); 130: interrupted.
    finished = run.returncode in (0, -signal.SIGINT) and out.splitlines()[-1] == str(exp_a)
    assert finished or run.returncode == 130, (run.returncode, err)
    assert f"b: trial {killed.position} ({killed.arm}) re-queued: its worker b@" in out
    resumed = mmlab("experiment", "resume", str(exp_b), "--results", url, timeout=300)
    assert resumed.returncode == 0, resumed.stderr

    # every trial ran once, on its own machine; verdicts per machine
    for exp_id in (exp_a, exp_b):
        assert [t.status for t in store.trials(exp_id)] == ["done"] * 16
        assert [len(t.samples) for t in store.measurements(exp_id).trials] == [1] * 16
    assert trial_of(store, exp_b, killed.id).started > killed.started
    (row,) = summary.summarize(store, [exp_a, exp_b]).rows
    # hugepage pageout takes ~1.4x on this kernel: both machines find it on a
    # quiet host; beside busy neighbours (stress-ng on both cores) neither
    # machine's 8 rounds resolved it once, so none must: each machine has its
    # verdict, and one that decides finds the regression, none the opposite
    assert set(row.by_machine) == {"a", "b"}
    assert all(row.by_machine[m].verdict == Verdict.REGRESSION for m in row.reproduced_on)
    for machine, exp_id in (("a", exp_a), ("b", exp_b)):
        assert f"machine {machine}, experiment {exp_id}: " in resumed.stdout
        (c,) = json.loads(mmlab("compare", str(exp_id), "--results", url, "--json").stdout)
        assert c["rounds"] == 8                     # its own machine's rounds, not both
        assert row.by_machine[machine].verdict == c["verdict"]
    assert "where the change reproduced" in resumed.stdout
    shown = mmlab("fleet", "summary", str(exp_a), "--results", url)
    assert shown.returncode == 0 and f"{len(row.reproduced_on)} of 2" in shown.stdout
    status = mmlab("fleet", "status", "--results", url)
    assert status.returncode == 0, status.stderr
    assert status.stdout.count("answers") == 2 and "does not answer" not in status.stdout


TRACKED = """\
name = "tracked"
workload = "pageout-refault"
repetitions = 6
memory_mb = 256
metrics = ["advise_ns_per_page"]
baseline = { kernel = "local:ta" }
[params]
mapping-kb = 1024
[matrix]
kernel = ["local:ta"]
"""
TRACK_SUITE = """\
name = "fleet-track"
reference = "local:ta"
kernels = ["local:ta", "local:tb", "local:tc", "local:td"]
metrics = ["advise_ns_per_page"]
[[profile]]
path = "tracked.toml"
"""


@pytest.mark.slow
def test_track_run_spreads_its_cells_over_two_real_workers(servers, tmp_path, workers, k612,
                                                           monkeypatch):
    """`track run --machines a,b`: one block of cells per machine at a time
    (tb and tc on a, td on b), each block's guest trials run by that
    machine's worker, stored in the fleet's store; a second run measures
    nothing."""
    from mmlab.kernels import images
    cache = tmp_path / "home" / "kernels"
    monkeypatch.setenv("MMLAB_KERNEL_CACHE", str(cache))     # the workers' too
    for name in ("ta", "tb", "tc", "td"):
        images.add_local(Path(k612.image), Path(k612.dir) / "config", name, cache)
    url, broker = fresh_db(servers, "track"), servers[1].url
    workers += [start_worker(n, url, broker, tmp_path) for n in ("a", "b")]
    wait_until("both workers answer",
               lambda: answering(url, engine.app(broker), ["a", "b"]), every=0.5)
    (tmp_path / "tracked.toml").write_text(TRACKED)
    (tmp_path / "suite.toml").write_text(TRACK_SUITE)
    first = mmlab("track", "run", str(tmp_path / "suite.toml"), "--results", url,
                  "--machines", "a,b", timeout=900)
    assert first.returncode == 0, first.stderr
    store = Store(url)
    cells = [r["id"] for r in store.experiments()
             if store.plan(r["id"]).profile.derived.startswith("track fleet-track")]
    assert sorted(store.plan(e).machine for e in cells) == ["a", "b"]
    for exp_id in cells:
        arms = len(store.plan(exp_id).arms)
        assert [t.status for t in store.trials(exp_id)] == ["done"] * (6 * arms)
    again = mmlab("track", "run", str(tmp_path / "suite.toml"), "--results", url,
                  "--machines", "a,b", timeout=120)
    assert again.returncode == 0 and "nothing new" in again.stdout, again.stderr


# ---------------------------------------------------------------- bare-metal machines

def registered_machine(name: str, bare_metal: str | None = None) -> registry.Registration:
    """A machine as its worker registered it, driving `bare_metal` if named."""
    probe = {"cpus": 2, "cpu_model": "a CPU", "memory": "8 GiB", "numa_nodes": 1,
             "kernel": "6.12", "accelerator": "tcg",
             **(registry.bare_metal(bare_metal, measurements.SIMULATED_BARE_METAL)
                if bare_metal else {})}
    return registry.Registration(name, f"{name}@here", "redis://broker", probe, 0.0)


@pytest.mark.parametrize("here", [None, "ipmi:elsewhere"])
def test_the_coordinator_leaves_the_bare_metal_machine_to_the_worker_that_drives_it(
        monkeypatch, here):
    """Whatever $MMLAB_BARE_METAL says where the coordinator runs (nothing,
    or nonsense), a bare-metal plan goes to a machine whose worker drives
    one, and is refused in one line for a machine whose worker drives none
    or for what no bare-metal machine runs yet."""
    if here is None:
        monkeypatch.delenv(baremetal.ENV, raising=False)
    else:
        monkeypatch.setenv(baremetal.ENV, here)
    plan = parse(TWO_KERNELS.format(timeout=60))
    box = registered_machine("box", "simulated:debian:6.12")
    coordinator.check(plan, False, box)
    assert box.describe().startswith("simulated:debian:6.12 by kexec (bare-metal (simulated: "
                                     "TCG guest)); worker on 2 x a CPU")
    with pytest.raises(MmlabError, match=r"^bare_metal = true: the worker of plain drives no "
                                         r"bare-metal machine \(on it: mmlab worker --name "
                                         r"plain --bare-metal MACHINE ...\)$"):
        coordinator.check(plan, False, registered_machine("plain"))
    counted = parse(TWO_KERNELS.format(timeout=60).replace(
        '"advise_ns_per_page"', '"advise_kernel_insns_per_page"'))
    with pytest.raises(MmlabError, match="instructions are not counted on bare metal yet"):
        coordinator.check(counted, False, box)
    coordinator.check(parse(FAKE), False, box)     # its host arms run where the worker runs


def test_a_bare_metal_worker_keeps_its_machine_up_while_trials_wait(tmp_path, monkeypatch):
    """A worker driving a machine (played by a thread) runs a two-kernel
    experiment's trials as their messages come: one start of the machine
    while trials wait in its queue, stopped when none does; a trial of
    another experiment whose kernel is not on the machine's disk starts it
    again.  The samples keep where they ran, and the fleet summary names
    the machine and says its figures are emulated."""
    kernels = {**KERNELS, "local:third": images.Kernel("local:third", "3.0", "local:third",
                                                       "0" * 64, "/nonexistent")}
    monkeypatch.setattr(images, "ready", lambda name, say: kernels[name])
    monkeypatch.setattr(images, "fetchable", lambda name: kernels[name])
    monkeypatch.delenv(baremetal.ENV, raising=False)
    machine = PlayedMachine(lambda kernel: framed(sample_lines(kernel).encode()))
    machine.accelerator = measurements.SIMULATED_BARE_METAL
    store = Store(tmp_path / "r")
    exp_id = store.create_experiment(parse(TWO_KERNELS.format(timeout=60)).model_copy(
        update={"machine": "box", "fleet": "f1"}))
    other = store.create_experiment(parse(TWO_KERNELS.format(timeout=60).replace(
        'kernel = ["local:old", "local:new"]', 'kernel = ["local:old", "local:third"]'))
        .model_copy(update={"machine": "box"}))
    waiting = [1]           # messages in box's queue after each trial, as the broker says
    worker = fleet_worker.Worker("box", str(tmp_path / "r"),
                                 bare_metal=baremetal.BareMetalTarget(machine, lambda line: None),
                                 queued=lambda: waiting[0])
    first, *rest = store.trials(exp_id)
    assert worker.handle(exp_id, first.id, False) == "done"
    assert (machine.starts, machine.stops) == (1, 0)            # kept up: trials wait
    third = next(t for t in store.trials(other) if t.arm == "kernel=local:third")
    assert worker.handle(other, third.id, False) == "done"
    assert machine.starts == 2                                   # local:third was not on its disk
    for i, t in enumerate(rest):
        waiting[0] = len(rest) - 1 - i
        assert worker.handle(exp_id, t.id, False) == "done"
    assert (machine.starts, machine.stops) == (3, 3)            # stopped once its queue was empty
    assert [t.status for t in store.trials(exp_id)] == ["done"] * 8
    for samples in store.measurements(exp_id).by_arm.values():
        for s in samples:
            assert (s.state["target"], s.state["machine"], s.state["accelerator"]) == \
                ("bare-metal", "played", measurements.SIMULATED_BARE_METAL)
            assert s.state["kexec_kernel"] == s.state["kernel"]
    found = summary.summarize(store, [exp_id])
    assert found.classes == {"box": f"played by kexec ({measurements.SIMULATED_BARE_METAL})"}
    (row,) = found.rows
    assert row.emulated == {"box"} and fleet_tables.sentence(row).startswith(
        "regression, emulated on box (1.3")


@pytest.mark.parametrize("machine, said", [
    ("ipmi:lab-box", "MMLAB_BARE_METAL='ipmi:lab-box': expected a machine file (NAME.toml) or "
                     "simulated:KERNEL, a TCG guest of KERNEL (debian:6.12, say) standing in "
                     "for the machine"),
    ("{tmp}/box.toml", "{tmp}/box.toml: unknown key 'colour' (a machine file knows name, base, "
                       "serial, baud, channel, console, disk, modules, power_cycle, "
                       "console_log, back, boot_timeout_s, power_timeout_s)"),
])
def test_a_worker_refuses_a_bad_bare_metal_machine_before_it_registers(tmp_path, machine,
                                                                        said):
    (tmp_path / "box.toml").write_text('name = "box"\ncolour = "red"\n')
    proc = subprocess.run([*MMLAB, "worker", "--name", "box", "--results",
                           "postgresql://nobody@127.0.0.1:9/none"], capture_output=True,
                          text=True,
                          env={**os.environ, baremetal.ENV: machine.format(tmp=tmp_path)})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"mmlab: {said.format(tmp=tmp_path)}"]


@pytest.mark.slow
def test_a_bare_metal_worker_runs_two_kernels_through_the_fleet(servers, tmp_path, workers,
                                                               k612, k73):
    """The slow bare-metal profile (debian:6.12 against debian:7.3, three
    rounds, each trial kexec'd from a TCG guest of 6.12 into its kernel and
    back) run with --machines box, box's worker driving the simulated
    machine and the coordinator naming none: the fleet's store holds the
    interleaved trials with their bare-metal provenance, and the verdicts
    and the summary say where they ran."""
    url, broker = fresh_db(servers, "baremetal"), servers[1].url
    workers.append(start_worker("box", url, broker, tmp_path,
                                "--bare-metal", "simulated:debian:6.12"))
    wait_until("box answers", lambda: answering(url, engine.app(broker), ["box"]),
               timeout=120, every=0.5)
    profile = tmp_path / "bm.toml"
    profile.write_text(SIMULATED_PROFILE)
    here = {k: v for k, v in os.environ.items() if k != baremetal.ENV}
    run = subprocess.run([*MMLAB, "experiment", "run", str(profile), "--machines", "box",
                          "--results", url, "--no-controls"], capture_output=True, text=True,
                         timeout=1800, env=here)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "not comparable" not in run.stdout           # the profile's cmdline reached 7.3
    assert "bare-metal (simulated: TCG guest) for 2 arm(s)" in run.stdout
    assert "box: experiment 1, simulated:debian:6.12 by kexec (bare-metal (simulated: TCG " \
        "guest)); worker on" in run.stdout
    store = Store(url)
    assert store.plan(1).machine == "box"
    trials = store.trials(1)
    assert [t.status for t in trials] == ["done"] * 6
    assert all({t.arm for t in trials if t.round == r} == {"kernel=debian:6.12",
                                                           "kernel=debian:7.3"}
               for r in {t.round for t in trials})              # rounds interleave the kernels
    envs = store.environments(1)
    for env in envs:
        assert (env["target"], env["machine"], env["accelerator"]) == \
            ("bare-metal", "simulated:debian:6.12", measurements.SIMULATED_BARE_METAL)
        assert 0 < env["switch_in_s"] < 120 and 0 < env["switch_back_s"] < 120
    assert sorted(e["kexec_kernel"] for e in envs) == ["debian:6.12"] * 3 + ["debian:7.3"] * 3
    measured = store.measurements(1).by_arm
    assert {arm: {s.state["kernel"] for s in ss} for arm, ss in measured.items()} == \
        {"kernel=debian:6.12": {k612.version}, "kernel=debian:7.3": {k73.version}}
    assert all(s.state["machine"] == "simulated:debian:6.12" and s.state["target"] == "bare-metal"
               for ss in measured.values() for s in ss)
    (row,) = summary.summarize(store, [1]).rows          # the verdict says emulated
    assert fleet_tables.sentence(row).startswith(f"{row.by_machine['box'].verdict}, emulated "
                                                 "on box (")
    print(json.dumps([{k: e[k] for k in ("kexec_kernel", "switch_in_s", "switch_back_s",
                                         "machine_boot_s")} for e in envs]))


@pytest.mark.slow
def test_a_worker_drives_a_real_machines_link_through_the_fleet(servers, tmp_path, workers,
                                                                k612, k73):
    """The same profile with box's worker driving a real machine's link: a
    box (tests/box.py) reached only through its tty, its staged library disk
    (on AHCI, so both kernels load ahci, libahci, libata, scsi_mod and
    sd_mod, fetched at staging) and its power command.  The worker powers it
    on, checks its library, runs the six trials interleaved by kexec, and
    the store and the summary name the machine by its file's name."""
    machine = box.wire(tmp_path, disk="ahci")
    staged = subprocess.run([*MMLAB, "bare-metal", "stage", str(machine), "--kernels",
                             "debian:6.12,debian:7.3", "--output", str(tmp_path)],
                            capture_output=True, text=True, timeout=1800)
    assert staged.returncode == 0, staged.stderr
    url, broker = fresh_db(servers, "realmachine"), servers[1].url
    workers.append(start_worker("box", url, broker, tmp_path, "--bare-metal", str(machine)))
    wait_until("box answers", lambda: answering(url, engine.app(broker), ["box"]),
               timeout=120, every=0.5)
    profile = tmp_path / "bm.toml"
    profile.write_text(SIMULATED_PROFILE)
    here = {k: v for k, v in os.environ.items() if k != baremetal.ENV}
    try:
        run = subprocess.run([*MMLAB, "experiment", "run", str(profile), "--machines", "box",
                              "--results", url, "--no-controls"], capture_output=True,
                             text=True, timeout=1800, env=here)
    finally:
        box.off(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "bare-metal for 2 arm(s)" in run.stdout
    assert "box: experiment 1, box by kexec (bare-metal); worker on" in run.stdout
    store = Store(url)
    trials = store.trials(1)
    assert [t.status for t in trials] == ["done"] * 6
    envs = store.environments(1)
    assert {(e["target"], e["machine"], e["accelerator"]) for e in envs} == \
        {("bare-metal", "box", measurements.BARE_METAL)}
    assert {e["kernel"] for e in envs} == {k612.version}             # the box's base
    assert sorted(e["kexec_kernel"] for e in envs) == ["debian:6.12"] * 3 + ["debian:7.3"] * 3
    measured = store.measurements(1).by_arm
    assert {arm: {s.state["kernel"] for s in ss} for arm, ss in measured.items()} == \
        {"kernel=debian:6.12": {k612.version}, "kernel=debian:7.3": {k73.version}}
    print(json.dumps([{k: e[k] for k in ("kexec_kernel", "switch_in_s", "switch_back_s",
                                         "kexec_load_s")} for e in envs]))
