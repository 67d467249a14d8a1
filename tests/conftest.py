"""Shared fixtures: a private state dir, mmwork runs, and the promise that the
test session leaves THP, KSM and swap exactly as it found them."""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mmlab.kernels import images
from mmlab.machine import knobs
from mmlab.workloads.build import mmwork_path

GLOBAL_SETTINGS = [
    knobs.THP_ENABLED, knobs.THP_DEFRAG,
    f"{knobs.KSM_DIR}/run", f"{knobs.KSM_DIR}/pages_to_scan", f"{knobs.KSM_DIR}/sleep_millisecs",
]


TRACEFS_SETTINGS = ["tracing_on", "buffer_size_kb", "options/stacktrace", "options/event-fork",
                    "events/lock/contention_begin/enable", "events/lock/contention_end/enable"]


def global_state() -> dict[str, object]:
    state: dict[str, object] = {p: knobs.read_setting(p) for p in GLOBAL_SETTINGS
                                if Path(p).exists()}
    tf = Path("/sys/kernel/tracing")
    state.update({f"tracefs:{n}": (tf / n).read_text().split()[0] for n in TRACEFS_SETTINGS
                  if (tf / n).exists()})
    if (tf / "set_event_pid").exists():
        state["tracefs:set_event_pid"] = (tf / "set_event_pid").read_text().split()
    state["swaps"] = knobs.active_swaps()
    state["tracefs mounted"] = knobs.mounted(knobs.TRACEFS)
    return state


# Test files whose tests run host trials or change host settings: their
# tests that boot no guest run in one pytest-xdist worker, in turn, as they
# did before the suite ran on two workers (the machine lock would order
# their setting changes anyway; together they also do not wait on each
# other's lock or time each other's trials).
HOST_FILES = {"test_attribution.py", "test_bad_input.py", "test_bench.py", "test_census.py",
              "test_cli.py",
              "test_cpufreq.py", "test_insns.py", "test_knobs.py", "test_memcg.py",
              "test_mm_workloads.py", "test_plan.py", "test_runner.py",
              "test_trial_processes.py", "test_workloads.py"}
GUEST_FIXTURES = {"k612", "k73"}


@pytest.hookimpl(tryfirst=True)      # before pytest-xdist's, which reads the mark
def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.name in HOST_FILES and not GUEST_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.xdist_group("host"))


def settled_state() -> dict[str, object]:
    """The global settings while no mmlab holds the machine lock: a test in
    the other worker may be in the middle of a host trial, with THP changed
    until it ends."""
    with knobs.machine_lock():
        return global_state()


@pytest.fixture(scope="session", autouse=True)
def settings_untouched(tmp_path_factory):
    os.environ["MMLAB_STATE_DIR"] = str(tmp_path_factory.mktemp("state"))
    before = settled_state()
    yield
    after = settled_state()
    assert after == before, f"global settings changed by the tests: {before} -> {after}"
    ksm_run = Path(f"{knobs.KSM_DIR}/run")
    if ksm_run.exists():
        assert ksm_run.read_text().strip() == before[str(ksm_run)]


def is_root() -> bool:
    return os.geteuid() == 0


def debian_program(program: str, package: str) -> str:
    """`program`'s path, installed from Debian's `package` first when a fresh
    machine lacks it (the tests fetch what they need rather than skip)."""
    found = shutil.which(program)
    if found is None:
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", package], check=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        found = shutil.which(program)
    assert found, f"{program}: not found after apt-get install {package}"
    return found


@pytest.fixture(scope="session")
def chromium() -> str:
    return debian_program("chromium", "chromium")


@pytest.fixture(scope="session")
def stress_ng() -> str:
    return debian_program("stress-ng", "stress-ng")


@pytest.fixture(scope="session")
def k612():
    """Debian's 6.12 for guests: fetched once (apt-get download), then cached."""
    return images.ensure("debian:6.12")


@pytest.fixture(scope="session")
def k73():
    """The newest release: trixie-backports, the split packaging (linux-binary,
    linux-base, linux-modules).  Fetched once, then cached."""
    return images.ensure("debian:7.3")


MMLAB = [sys.executable, "-m", "mmlab.cli"]

# A small profile of two THP arms on the host: quick, and judged.
THP_PAIR = """
name = "thp-pair"
workload = "pageout-refault"
repetitions = 6
metrics = ["advise_ns_per_page"]
baseline = { thp = "nohugepage" }
[params]
mapping-kb = 1024
[matrix]
thp = ["hugepage", "nohugepage"]
"""


def mmlab(*args: str, timeout: float | None = None,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The mmlab command, with `env` added to this process's environment."""
    return subprocess.run([*MMLAB, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env} if env else None)


def run_profile(tmp_path: Path, text: str, *args: str, timeout: float | None = None,
                env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    """Write `text` as a profile and `mmlab experiment run` it into tmp_path/r."""
    profile = tmp_path / "profile.toml"
    profile.write_text(text)
    results = tmp_path / "r"
    return mmlab("experiment", "run", str(profile), "--results", str(results), *args,
                 timeout=timeout, env=env), results


def mmwork(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(mmwork_path()), *args], capture_output=True, text=True)


def samples_of(*args: str) -> list[dict]:
    proc = mmwork(*args)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    return [json.loads(line) for line in lines]


GOLDEN = Path(__file__).parent / "golden"


def check_golden(name: str, got: str) -> None:
    """Compare `got` with tests/golden/NAME, or write it there when
    MMLAB_UPDATE_GOLDEN=1 (an intended change of a rendered output)."""
    path = GOLDEN / name
    if os.environ.get("MMLAB_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(got)
        return
    want = path.read_text() if path.exists() else ""
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                            f"tests/golden/{name}", "rendered now"))
        pytest.fail(f"tests/golden/{name} differs from what renders now; if the change is "
                    "intended, regenerate it with MMLAB_UPDATE_GOLDEN=1\n" + diff,
                    pytrace=False)
