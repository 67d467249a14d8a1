"""Every process a trial starts ends with the trial (machine/memcg.py's
groups, mmwork.py's `_run`): a command's `setsid` and double-forked
descendants leave its process group, never the trial's cgroup, and are
gone when `mmlab run` returns, after a success, a failure and Ctrl-C."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from mmlab.errors import MmlabError
from mmlab.machine import memcg, proc

from .conftest import MMLAB

_numbers = itertools.count()


def marker() -> str:
    """A number no other process on this machine has as its argument."""
    return f"{os.getpid()}{next(_numbers):03d}"


def running(mark: str) -> list[int]:
    """The live (not zombie) processes `sleep <mark>` on this machine."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")
            state = stat.read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue            # gone while we looked
        if cmdline[:2] == [b"sleep", mark.encode()] and state != "Z":
            found.append(int(stat.parent.name))
    return found


def escaping(mark: str, then: str) -> str:
    """A command that leaves `sleep <mark>` running in a session of its own
    twice, once `setsid` straight from it and once double-forked (the
    daemon's way: its parent exits), waits until both run, then `then`."""
    return (f"setsid sleep {mark} & (setsid sleep {mark} &); "
            f"while [ $(pgrep -fxc 'sleep {mark}') -lt 2 ]; do sleep 0.05; done; {then}")


def mmlab_run(tmp_path: Path, command: str) -> subprocess.Popen:
    env = {**os.environ, "MMLAB_LOCK": str(tmp_path / "lock")}
    return subprocess.Popen([*MMLAB, "run", "exec", "--samples", "1", "--results",
                             str(tmp_path / "r"), "--", "sh", "-c", command],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def gone_after(mark: str) -> list[int]:
    """What still runs of `mark`, killed here so that no test leaves it."""
    left = running(mark)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


@pytest.mark.parametrize("then, status", [("echo done=1", 0), ("echo why; exit 1", 2)])
def test_a_commands_setsid_and_double_forked_children_end_with_its_trial(tmp_path, then,
                                                                         status):
    """A trial that succeeds and one that fails: both escaped sleeps ran
    (the command waited for them), and none is left when mmlab returns."""
    mark = marker()
    proc = mmlab_run(tmp_path, escaping(mark, then))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == status, err
    assert gone_after(mark) == []


def test_ctrl_c_to_mmlab_mid_trial_ends_the_whole_trial(tmp_path):
    """SIGINT to mmlab alone while its command runs (the command in
    mid-sleep, its escaped children running): mmlab exits 130 and every
    process of the trial is gone, its groups too."""
    mark = marker()
    proc = mmlab_run(tmp_path, escaping(mark, f"sleep {mark}"))
    deadline = time.monotonic() + 240
    while len(running(mark)) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert gone_after(mark) == []
    left = list(Path("/sys/fs/cgroup").glob(f"**/{memcg.PREFIX}{proc.pid}.*"))
    assert left == []


def test_a_run_killed_before_it_could_end_its_trial_is_ended_by_the_next(tmp_path):
    """A trial's group whose runner is gone (SIGKILLed) with a process still
    in it: the next trial's sweep ends that process and removes the group."""
    mark = marker()
    with memcg.trial_group() as group:
        assert group.kill is not None, group.why
        where = group.kill.parent
    stale = where / f"{memcg.PREFIX}999999999.1"     # no such pid: its runner is gone
    stale.mkdir()
    child = subprocess.Popen(["sleep", mark], preexec_fn=lambda: (stale / "cgroup.procs")
                             .write_text("0"), start_new_session=True)
    try:
        with memcg.trial_group():
            assert child.wait(timeout=10) == -signal.SIGKILL
            assert not stale.exists()
    finally:
        gone_after(mark)
        child.wait()


V1_HYBRID = """\
35 31 0:31 / {root}/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:37 / {root}/unified rw,relatime - cgroup2 cgroup2 rw
"""
V2_ONLY = "29 23 0:26 / {root}/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_each_machine_shape_gets_a_group_to_end_its_trials_by(tmp_path):
    """v1 with a cgroup2 mount beside it (this lab's host): the memory group
    on v1, the group that ends the trial on v2; v2 alone, without the memory
    controller for children: that group and why nothing counts; no cgroup2:
    no such group, and mmwork's process group is what ends the trial."""
    for sub in ("memory/job", "unified/job"):
        (tmp_path / sub).mkdir(parents=True)
    groups = "4:memory:/job\n0::/job\n"
    hybrid = memcg.groups(V1_HYBRID.format(root=tmp_path), groups)
    assert hybrid.kill is not None and hybrid.kill.parent == tmp_path / "unified/job"
    v2 = memcg.groups(V2_ONLY.format(root=tmp_path), "0::/job\n")
    assert v2.path is None and "memory controller" in v2.why
    assert v2.kill is not None and v2.kill.parent == tmp_path / "unified/job"
    none = memcg.groups("22 1 0:21 / /proc rw - proc proc rw\n", "0::/\n")
    assert none.kill is None and none.dirs() == [] and "no memory cgroup" in none.why


def test_a_tool_that_times_out_is_killed_with_what_it_started():
    """proc.call's tools (a stress-ng peer, make, perf): one that does not
    answer in time is killed with its whole process group, its background
    children too, not only its first process."""
    mark = marker()
    with pytest.raises(MmlabError, match="no answer after 0.5 s"):
        proc.call(["sh", "-c", f"sleep {mark} & sleep {mark}"], timeout=0.5)
    assert gone_after(mark) == []


def test_a_ctrl_c_lost_while_a_trial_started_is_raised_and_ends_it(monkeypatch):
    """A Ctrl-C whose exception Python dropped (its handler ran inside a
    fork hook while mmwork was started) is raised once mmwork has started,
    inside the trial, which then ends whole."""
    from mmlab.errors import Interrupted
    from mmlab.workloads import execwork, mmwork
    mark = marker()
    wl = execwork.build(["sh", "-c", f"setsid sleep {mark} & true"])
    monkeypatch.setattr(Interrupted, "received", True)
    with pytest.raises(Interrupted):
        mmwork.sample(wl, {}, samples=1)
    assert gone_after(mark) == []
