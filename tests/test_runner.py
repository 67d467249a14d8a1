"""Experiments end to end on this kernel: stored, compared, refused without
consent, and interrupted by SIGINT and SIGKILL without losing or repeating a
trial or leaving a global setting changed."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from mmlab import knobs

from .conftest import MMLAB, is_root, mmlab, run_profile

THP = Path(knobs.THP_ENABLED)

QUICK = """\
name = "quick"
workload = "populate-unmap"
repetitions = 3
metrics = ["populate_ns_per_page", "unmap_ns_per_page"]
baseline = "small"
seed = 11

[params]
seconds = 0.05
workers = 1

[[arms]]
name = "small"
set = { bytes = "4K" }

[[arms]]
name = "big"
set = { bytes = "64K" }
"""

# Two THP modes, long enough trials to be killed in the middle of one.
THP_MODES = """\
name = "thp-modes"
workload = "populate-unmap"
repetitions = 4
metrics = ["populate_ns_per_page"]
baseline = { thp_mode = "never" }
host_changes = true

[params]
seconds = 0.4
workers = 1

[matrix]
thp_mode = ["always", "never"]
"""


def statuses(results: Path) -> dict[str, int]:
    db = sqlite3.connect(f"file:{results}/mmlab.sqlite?mode=ro", uri=True)
    try:
        return dict(db.execute("SELECT status, COUNT(*) FROM trials GROUP BY status").fetchall())
    finally:
        db.close()


def wait_done(results: Path, n: int, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if statuses(results).get("done", 0) >= n:
                return
        except sqlite3.OperationalError:
            pass          # the store or its schema is not there yet
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} trials done in {timeout} s")


@pytest.fixture
def stop_children():
    """Whatever a test starts is stopped gracefully (SIGINT: mmlab restores
    its settings) even when the test fails half-way."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_experiment_stores_every_trial_and_compares(tmp_path):
    proc, _ = run_profile(tmp_path, QUICK)
    assert proc.returncode == 0, proc.stderr
    exp_id = proc.stdout.strip().splitlines()[-1]
    assert exp_id == "1"                                   # the ID is the last line
    assert statuses(tmp_path / "r") == {"done": 6}
    db = sqlite3.connect(tmp_path / "r" / "mmlab.sqlite")
    env = json.loads(db.execute("SELECT environment FROM trials LIMIT 1").fetchone()[0])
    assert {"kernel", "cmdline", "cpu_model", "thp_enabled", "ksm_run", "swap",
            "mmlab_version", "git_commit"} <= env.keys()
    order = [r[0] for r in db.execute("SELECT a.name FROM trials t JOIN arms a ON a.id=t.arm_id "
                                      "ORDER BY t.position")]
    assert all(sorted(order[i:i + 2]) == ["big", "small"] for i in (0, 2, 4))   # interleaved
    rows = json.loads(mmlab("compare", exp_id, "--results", str(tmp_path / "r"), "--json").stdout)
    assert {r["metric"] for r in rows} == {"populate_ns_per_page", "unmap_ns_per_page"}
    for r in rows:
        assert {"metric", "arm", "baseline", "ratio", "ci_low", "ci_high", "p_value", "verdict",
                "reason"} <= r.keys()
        assert (r["arm"], r["baseline"]) == ("big", "small")
    csv_out = mmlab("compare", exp_id, "--results", str(tmp_path / "r"), "--csv").stdout
    assert csv_out.splitlines()[0].startswith("metric,arm,baseline")
    listing = mmlab("experiments", "--results", str(tmp_path / "r")).stdout
    assert "quick" in listing and "populate-unmap" in listing
    shown = mmlab("show", exp_id, "--results", str(tmp_path / "r")).stdout
    assert "6 done" in shown and "order: 0:" in shown


def test_host_changes_are_refused_without_consent(tmp_path):
    proc, _ = run_profile(tmp_path, THP_MODES.replace("host_changes = true\n", ""))
    assert proc.returncode == 2
    assert f"would change {knobs.THP_ENABLED}" in proc.stderr
    assert "--allow-host-changes" in proc.stderr
    assert not (tmp_path / "r" / "mmlab.sqlite").exists() or statuses(tmp_path / "r") == {}


needs_root = pytest.mark.skipif(not is_root() or not THP.exists(), reason="needs root and THP")


def start_thp_experiment(tmp_path: Path, **popen) -> tuple[subprocess.Popen, Path]:
    """The THP-modes profile, started in the background."""
    profile = tmp_path / "thp.toml"
    profile.write_text(THP_MODES)
    results = tmp_path / "r"
    proc = subprocess.Popen([*MMLAB, "experiment", "run", str(profile), "--results",
                             str(results)], **popen)
    return proc, results


@needs_root
def test_sigkill_loses_at_most_the_trial_in_flight_and_resume_finishes(tmp_path, stop_children):
    before = THP.read_text()
    proc, results = start_thp_experiment(tmp_path, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True)
    stop_children.append(proc)
    wait_done(results, 3)
    os.killpg(proc.pid, signal.SIGKILL)          # mmlab and its mmwork, no cleanup at all
    proc.wait()
    left_changed = THP.read_text() != before      # killed inside a trial, or between two
    after_kill = statuses(results)
    assert after_kill.get("done", 0) >= 3 and after_kill.get("failed", 0) == 0
    done_before = after_kill["done"]

    resumed = mmlab("experiment", "resume", "1", "--results", str(results))
    assert resumed.returncode == 0, resumed.stderr
    if left_changed:
        assert "an earlier run did not finish; restored" in resumed.stderr
    assert statuses(results) == {"done": 8}
    db = sqlite3.connect(results / "mmlab.sqlite")
    per_trial = db.execute("SELECT COUNT(*) FROM samples GROUP BY trial_id").fetchall()
    assert len(per_trial) == 8 and {n for (n,) in per_trial} == {1}   # none lost, none twice
    assert f"{done_before} already done" in resumed.stdout or \
        f"{8 - done_before} run now" in resumed.stdout
    assert THP.read_text() == before


@needs_root
def test_ctrl_c_replans_the_trial_and_restores_at_once(tmp_path, stop_children):
    before = THP.read_text()
    proc, results = start_thp_experiment(tmp_path, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True)
    stop_children.append(proc)
    wait_done(results, 2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "interrupted" in err
    st = statuses(results)
    assert st.get("running", 0) == 0 and st.get("failed", 0) == 0 and st["done"] >= 2
    assert THP.read_text() == before
    assert not (knobs.state_dir() / "journal.json").exists()
