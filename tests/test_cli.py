"""The mmlab command as a user meets it: run, workloads, probe, errors, and
interruptions that must leave the machine as it was."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import MMLAB, THP_PAIR, is_root, mmlab

KSM_RUN = Path("/sys/kernel/mm/ksm/run")
EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def test_run_json_prints_only_samples():
    proc = mmlab("run", "populate-unmap", "--samples", "2", "--seconds", "0.1", "--json")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2
    assert all(json.loads(line)["workload"] == "populate-unmap" for line in lines)


def test_run_prints_the_table_median_cv_and_state():
    proc = mmlab("run", "pageout-refault", "--samples", "3", "--mapping-kb", "2048", "--rounds", "2",
                 "--min-ms", "0")
    assert proc.returncode == 0, proc.stderr
    for text in ("cycle_ns_per_page", "median", "CV", "page state", "thp_backed_fraction",
                 "thp_split_page"):
        assert text in proc.stdout


@pytest.mark.parametrize("args, message", [
    (("run", "nope"), "No such command 'nope'"),
    (("run", "pageout-refault", "--thp", "maybe"), "--thp: 'maybe' is not one of"),
    (("run", "pageout-refault", "--mapping-kb", "-1"), "--mapping-kb: -1 is outside"),
    (("run", "unmap-young", "--colour", "red"), "No such option: --colour"),
    (("run", "ksm-rmap"), "pass --allow-host-changes"),
    (("run", "exec", "--insns", "--per", "pages", "--", "true"),
     "per: units read from the output need metrics_from"),
    (("run", "exec", "--functions", "5", "--results", "/nonexistent/never-made", "--", "true"),
     "--functions needs a guest kernel"),
    (("run", "pageout-refault", "--bare-metal"), "--bare-metal needs the kernel to kexec into"),
    (("run", "pageout-refault", "--bare-metal", "--kernel", "debian:7.3", "--vcpus", "2"),
     "--vcpus is for a guest: a bare-metal machine has the CPUs"),
])
def test_errors_are_one_line_with_exit_2(args, message):
    proc = mmlab(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_bad_paths_and_usage_are_one_line_with_exit_2(tmp_path):
    """What once escaped as tracebacks or framed usage boxes."""
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "mmlab.sqlite").write_text("not a database")
    afile = tmp_path / "a-file"
    afile.write_text("x")
    cases = [
        (("bundle", "1", str(afile), "--results", str(tmp_path / "lab")), "is not a directory"),
        (("compare", "1", "--results", str(corrupt)), "not an mmlab store"),
        (("compare", "1", "--results", str(afile)), "not a directory"),
        (("run", "pageout-refault", "--samples", "0"), "--samples"),
        (("report", "1", "--format", "pdf", "--results", str(tmp_path / "lab")), "--format"),
    ]
    for args, message in cases:
        proc = mmlab(*args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], (args, proc.stderr)


def test_experiment_plan_shows_the_arms_and_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    proc = mmlab("experiment", "plan", str(Path(__file__).parent.parent / "experiments"
                                          / "pageout-thp-modes.toml"))
    assert proc.returncode == 0, proc.stderr
    assert "3 arms x 12 to 25 rounds, 36 trials planned" in proc.stdout
    assert "thp=nohugepage" in proc.stdout and "(baseline)" in proc.stdout
    assert "verdicts: A/A 'no change' >= 90% and a +10% change found >= 95% up to 5.0% noise" \
        in proc.stdout and proc.stderr == ""
    assert not (tmp_path / "mmlab-results").exists()
    five = mmlab("experiment", "plan", str(EXPERIMENTS / "seed003-unmap-young-insns-7.3.toml"))
    assert "5 rounds cannot reach a decision at 5% noise per trial, its tolerance: A/A 'no " \
        "change' 3%" in five.stderr


def test_selftest_simulates_one_profiles_shape():
    """A 5-round guest profile: its table, the noise it decides up to, and
    exit status 1 for the targets it misses."""
    proc = mmlab("selftest", "verdicts", "--profile",
                 str(EXPERIMENTS / "seed003-unmap-young-insns-7.3.toml"), "--experiments", "300")
    assert proc.returncode == 1, proc.stderr
    out = " ".join(proc.stdout.split())
    assert "seed003-unmap-young-insns-7.3: 2 arms, 1 pairs x 2 metrics (2 tests), 5 rounds" in out
    assert "reached up to 1.0% noise per trial" in out and "LN5: A/A no change 4" in out


def test_workloads_json_lists_metrics_with_direction():
    proc = mmlab("workloads", "--json")
    table = {w["name"]: w for w in json.loads(proc.stdout)}
    directions = {m["name"]: m["direction"] for m in table["mremap-churn"]["metrics"]}
    assert directions["ops_per_s_real"] == "higher" and directions["sys_s"] == "lower"


def test_probe_tells_the_truth_about_this_machine():
    facts = {f["what"]: f for f in json.loads(mmlab("probe", "--json").stdout)}
    assert platform.release() in facts["kernel"]["value"]
    assert str(os.cpu_count()) in facts["CPUs"]["value"]
    assert (facts["KSM"]["value"] == "absent") == (not KSM_RUN.exists())
    nodes = len(list(Path("/sys/devices/system/node").glob("node[0-9]*")))
    assert facts["NUMA nodes"]["value"].startswith(str(nodes))
    hw = subprocess.run(["perf", "stat", "-e", "instructions", "true"], capture_output=True,
                        text=True)
    assert facts["hardware counters"]["ok"] == ("<not supported>" not in hw.stderr)


def wait_for(cond, timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False


def children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


needs_ksm = pytest.mark.skipif(not is_root() or not KSM_RUN.exists(),
                               reason="needs root and KSM")


def runs_mmwork(pid: int) -> bool:
    """Is one of `pid`'s children an mmwork?"""
    def name(kid: int) -> str:
        try:
            return Path(f"/proc/{kid}/comm").read_text().strip()
        except OSError:
            return ""
    return any(name(kid) == "mmwork" for kid in children(pid))


def start_ksm_run(**popen) -> subprocess.Popen:
    """`mmlab run ksm-rmap` with a large split, returned once its own mmwork
    runs KSM: KSM on alone may be another test's run (the other pytest
    worker's, whose host trial this one waits behind on the machine lock)."""
    proc = subprocess.Popen([*MMLAB, "run", "ksm-rmap", "--vmas", "20000", "--samples", "1",
                             "--allow-host-changes"], stdout=subprocess.DEVNULL, **popen)
    assert wait_for(lambda: runs_mmwork(proc.pid) and KSM_RUN.read_text().strip() == "1",
                    timeout=120), "KSM never started"
    return proc


@needs_ksm
def test_sigint_to_mmwork_restores_ksm():
    from mmlab.workloads.build import mmwork_path
    before = KSM_RUN.read_text()
    proc = subprocess.Popen([str(mmwork_path()), "ksm-rmap", "--vmas", "20000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert wait_for(lambda: KSM_RUN.read_text().strip() == "1"), "KSM never started"
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    assert KSM_RUN.read_text() == before


@needs_ksm
def test_sigkill_of_mmwork_under_mmlab_restores_ksm():
    """mmwork killed outright cannot restore anything; mmlab's journal does."""
    before = KSM_RUN.read_text()
    proc = start_ksm_run(stderr=subprocess.PIPE, text=True)
    for kid in children(proc.pid):
        os.kill(kid, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "ksm-rmap failed" in err
    assert KSM_RUN.read_text() == before


@needs_ksm
def test_sigkill_of_mmlab_is_repaired_on_next_start():
    before = KSM_RUN.read_text()
    proc = start_ksm_run(stderr=subprocess.DEVNULL)
    kids = children(proc.pid)
    proc.kill()
    proc.wait()
    for kid in kids:       # mmwork would restore on its own exit; kill it too
        os.kill(kid, signal.SIGKILL)
    time.sleep(0.2)
    assert KSM_RUN.read_text().strip() == "1"   # left changed by the crash
    proc = mmlab("probe", "--json")
    assert "an earlier run did not finish; restored" in proc.stderr
    assert KSM_RUN.read_text() == before


def test_run_and_experiment_run_take_their_samples_through_the_same_target(tmp_path,
                                                                           monkeypatch):
    """`mmlab run` is an experiment of one arm: with the targets replaced by
    one fake, both commands' trials reach that fake's run_trial, and both
    store what it returned."""
    from typer.testing import CliRunner

    from mmlab.cli import app
    from mmlab.cli import run as run_cmd
    from mmlab.store import Store
    from mmlab.targets import TargetPool

    from .fake_target import FakeTarget
    fake = FakeTarget(cv=0.01)
    monkeypatch.setattr(TargetPool, "local_target", lambda pool, arm: fake)
    run_cmd.register()
    results = str(tmp_path / "r")
    cli = CliRunner()
    ran = cli.invoke(app, ["run", "pageout-refault", "--samples", "2", "--thp", "hugepage",
                           "--results", results])
    assert ran.exit_code == 0, ran.output
    profile = tmp_path / "p.toml"
    profile.write_text(THP_PAIR)
    exp = cli.invoke(app, ["experiment", "run", str(profile), "--results", results])
    assert exp.exit_code == 0, exp.output
    assert fake.trials[0] == "run"
    assert sorted(fake.trials[1:]) == ["thp=hugepage"] * 6 + ["thp=nohugepage"] * 6
    store = Store(results, create=False)
    (one,) = store.samples_by_arm(1).values()
    assert len(one) == 2 and one[0].params["thp"] == "hugepage"
    assert {len(v) for v in store.samples_by_arm(2).values()} == {6}



def test_every_running_command_reaches_the_runner_through_run_experiment(tmp_path,
                                                                          monkeypatch):
    """`mmlab run`, `experiment run|resume`, `ab`, `narrow` and `track run`
    all go through driver.run_experiment, and the runner runs only inside
    it: with the targets replaced by one fake, every runner.run happens
    while some command's run_experiment is under way."""
    from types import SimpleNamespace

    from typer.testing import CliRunner

    from mmlab.cli import app
    from mmlab.cli import run as run_cmd
    from mmlab.kernels import images, kbuild
    from mmlab.run import driver, runner
    from mmlab.targets import TargetPool
    from mmlab.track import releases

    from .fake_target import FakeTarget
    from .test_track import Local, write_suite
    fake = FakeTarget(cv=0.01)
    monkeypatch.setattr(TargetPool, "local_target", lambda pool, arm: fake)
    monkeypatch.setattr(kbuild, "ab_pair", lambda *a: (
        SimpleNamespace(name="local:a", source="tree"),
        SimpleNamespace(name="local:b", source="tree + patch")))
    monkeypatch.setattr(releases, "Catalog", Local)
    monkeypatch.setattr(images, "cached", lambda cache=None: [   # narrow orders them by version
        images.Kernel(f"local:{x}", f"6.{i}.0", "tree", "", "") for i, x in enumerate("abc")])
    depth, calls, outside = [0], [], []
    real_driver, real_runner = driver.run_experiment, runner.run

    def through_driver(store, start, *args, **kwargs):
        calls.append(start if isinstance(start, int) else type(start).__name__)
        depth[0] += 1
        try:
            return real_driver(store, start, *args, **kwargs)
        finally:
            depth[0] -= 1

    def runner_run(*args, **kwargs):
        if not depth[0]:
            outside.append(args[1])
        return real_runner(*args, **kwargs)
    monkeypatch.setattr(driver, "run_experiment", through_driver)
    monkeypatch.setattr(runner, "run", runner_run)
    run_cmd.register()
    results = str(tmp_path / "r")
    (tmp_path / "pair.toml").write_text(THP_PAIR)
    suite = write_suite(tmp_path)                 # and p.toml, a profile over local kernels
    patch = tmp_path / "fix.patch"
    patch.write_text("--- a/x\n+++ b/x\n")
    # narrow refuses a profile whose rounds cannot decide its two metrics (6 paired)
    (tmp_path / "n.toml").write_text((tmp_path / "p.toml").read_text().replace(
        "repetitions = 6", "repetitions = 7"))
    commands = {
        "run": ["run", "pageout-refault", "--samples", "2"],
        "experiment run": ["experiment", "run", str(tmp_path / "pair.toml")],
        "experiment resume": ["experiment", "resume", "2"],
        "ab": ["ab", str(tmp_path / "p.toml"), "--patch", str(patch)],
        "narrow": ["narrow", str(tmp_path / "n.toml"), "--kernels", "local:a,local:b,local:c"],
        "track run": ["track", "run", str(suite)],
    }
    cli = CliRunner()
    for name, args in commands.items():
        before = len(calls)
        done = cli.invoke(app, [*args, "--results", results])
        assert done.exit_code == 0, (name, done.output)
        assert len(calls) > before, f"{name} did not call run_experiment"
    assert not outside, f"runner.run outside run_experiment for experiments {outside}"
    assert calls[:3] == ["Plan", "Plan", 2]


def test_attribution_that_no_arm_got_is_a_failure(tmp_path, monkeypatch):
    """`experiment run --attribute` whose every arm's attribution fails
    stores the trials and exits 1, saying so, rather than 0."""
    from typer.testing import CliRunner

    from mmlab.cli import app
    from mmlab.errors import MmlabError
    from mmlab.targets import TargetPool

    from .fake_target import FakeTarget

    class Unattributable(FakeTarget):
        def attribute(self, arm, plan):
            raise MmlabError("instrumentation produced nothing here")
    fake = Unattributable(cv=0.01)
    monkeypatch.setattr(TargetPool, "local_target", lambda pool, arm: fake)
    (tmp_path / "pair.toml").write_text(THP_PAIR)
    got = CliRunner().invoke(app, ["experiment", "run", str(tmp_path / "pair.toml"),
                                   "--attribute", "--results", str(tmp_path / "r")])
    assert got.exit_code == 1, got.output
    assert "failed: instrumentation produced nothing here" in got.output
    assert "no arm of experiment 1 got any" in got.output


def test_the_readmes_first_screen_is_the_front_door():
    """What mmlab is, the two setup commands, and the ways in, each named
    with its command (an experiment, the tracker, the reporter's own
    program counted) and pointing at a page and section that exist."""
    import re
    root = EXPERIMENTS.parent
    screen = "\n".join((root / "README.md").read_text().splitlines()[:25])
    for command in ("make demo", "make test", "mmlab experiment run", "mmlab track run",
                    "mmlab run exec --source", "--insns"):
        assert command in screen, command
    links = re.findall(r"\]\(([^)#]*)(?:#([^)]*))?\)", screen)
    assert {page for page, _ in links} >= {"docs/tracker.md", "docs/exec.md"}
    for page, anchor in links:
        text = (root / (page or "README.md")).read_text()
        slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                 for h in re.findall(r"^#+ (.*)$", text, re.M)}
        assert not anchor or anchor in slugs, (page, anchor)
