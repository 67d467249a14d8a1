"""A memory cgroup of its own for each host trial (machine/memcg.py), and
mmwork reading it (--own-memcg)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from mmlab import workloads
from mmlab.machine import memcg
from mmlab.workloads import mmwork
from mmlab.workloads.build import mmwork_path

from .conftest import mmwork as run_mmwork

V1_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:31 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
41 31 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V1_GROUPS = "4:memory:/box/job\n1:cpu,cpuacct:/\n0::/\n"
V2_MOUNTS = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
V2_GROUPS = "0::/user.slice/mmlab.scope\n"


def test_the_runners_own_memory_cgroup_is_found_on_v1_and_v2():
    """v1's memory hierarchy wins where it exists (v2 then has no memory
    controller); v2's "0::" line otherwise; neither: why, in words."""
    assert memcg.parent(V1_MOUNTS, V1_GROUPS) == (Path("/sys/fs/cgroup/memory/box/job"), "")
    assert memcg.parent(V2_MOUNTS, V2_GROUPS) == (
        Path("/sys/fs/cgroup/user.slice/mmlab.scope"), "")
    assert memcg.parent(V2_MOUNTS, "0::/\n") == (Path("/sys/fs/cgroup"), "")
    where, why = memcg.parent("22 1 0:21 / /proc rw - proc proc rw\n", "0::/\n")
    assert where is None and "no memory cgroup" in why


def group_of(pid: int) -> str:
    return next(line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text()
                .splitlines() if "memory" in line.split(":")[1].split(",")
                or line.startswith("0::"))


def test_a_trial_runs_in_a_group_of_its_own_that_is_gone_after_it():
    """The group is made under the runner's own, a process started in it
    counts there, and the group is removed after the trial; one that a
    killed run left (its runner's pid gone) is removed by the next."""
    where, _ = memcg.parent(Path("/proc/self/mountinfo").read_text(),
                            Path("/proc/self/cgroup").read_text())
    assert where is not None
    stale = where / f"{memcg.PREFIX}999999999.1"    # no such pid: its runner is gone
    stale.mkdir()
    with memcg.trial_group() as group:
        assert not stale.exists()
        assert group.path is not None and group.path.parent == where, group.describe()
        proc = subprocess.Popen(["sleep", "5"], preexec_fn=group.enter)
        try:
            assert group_of(proc.pid).endswith(group.path.name)
            assert str(proc.pid) in (group.path / "cgroup.procs").read_text().split()
        finally:
            proc.kill()
            proc.wait()
        path = group.path
    assert not path.exists()


def test_a_straggler_is_ended_with_its_trial_and_its_groups_removed():
    """A process still in the groups when the trial ends is killed (it is
    the trial's) and the groups go with it."""
    with memcg.trial_group() as group:
        assert group.path is not None
        proc = subprocess.Popen(["sleep", "30"], preexec_fn=group.enter)
    try:
        assert proc.wait(timeout=10) == -9
        assert not any(path.exists() for path in group.dirs())
    finally:
        proc.kill()
        proc.wait()


def test_mmwork_reads_its_own_group_and_the_host_target_gives_it_one():
    """A sample in the trial's group carries the group's own fault count
    (the trial's page faults, not the machine's), its THP and swap in use,
    and which cgroup version it read; without a memory cgroup mmwork
    refuses --own-memcg in one line."""
    wl = workloads.get("pageout-refault")
    with memcg.trial_group() as group:
        (s,) = mmwork.sample(wl, {"mapping-kb": 4096}, samples=1, warmups=0, group=group)
    st = s.state
    assert str(st["memcg"]).startswith(("v1", "v2"))
    assert {"memcg_pgfault", "memcg_anon_thp_kb"} <= st.keys()
    # 1,024 pages written twice (before and after MADV_PAGEOUT), at least
    assert st["memcg_pgfault"] >= 2 * 1024
    assert s.rusage["minflt"] <= st["memcg_pgfault"] <= s.vmstat_delta["pgfault"] + 1
    assert run_mmwork("pageout-refault", "--own-memcg", "--check").returncode == 0
    assert "own-memcg" in workloads.HARNESS_PARAMS
    # a machine without a memory cgroup: this one with its cgroup mounts
    # taken away, in a mount namespace of the test's own
    hide = " ".join(f"umount -l {m};" for m in cgroup_mounts())
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           f"{hide} exec {mmwork_path()} pageout-refault --own-memcg"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert "--own-memcg: no memory cgroup found" in line, line


def cgroup_mounts() -> list[str]:
    """Where cgroup hierarchies (v1 or v2) are mounted here."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        head, _, tail = line.partition(" - ")
        if tail.split()[0] in ("cgroup", "cgroup2"):
            points.append(head.split()[4])
    return points


# The v2 side, in a guest (this lab's host has its memory controller on
# cgroup v1): a script mounts cgroup2, makes a group with the memory
# controller, moves itself in and runs mmwork there with --own-memcg; the
# sample it prints is the exec workload's output.
V2_IN_A_GUEST = """\
set -e
mount -t cgroup2 none /sys/fs/cgroup
echo +memory > /sys/fs/cgroup/cgroup.subtree_control
mkdir /sys/fs/cgroup/trial
echo $$ > /sys/fs/cgroup/trial/cgroup.procs
echo madvise > /sys/kernel/mm/transparent_hugepage/enabled
/bin/mmwork pageout-refault --mapping-kb 8192 --thp hugepage --own-memcg --warmups 0
echo n_pages=1
"""


def test_on_cgroup_v2_the_trials_own_group_counts_its_thp_faults(k612):
    """On v2 the group's memory.stat has THP events: the sample's
    memcg_thp_fault_alloc counts the mapping's own PMD faults, and the
    group's anonymous THP is there after them."""
    import json

    from mmlab.machine.knobs import HostSettings
    from mmlab.targets import boot, qemu
    from mmlab.workloads import execwork
    wl = execwork.build(["sh", "-c", V2_IN_A_GUEST], metrics_from="key=value",
                        declared={"n_pages": "higher"})
    guest = boot.Guest(k612, vcpus=1, memory_mb=512, timeout_s=300)
    (s,) = qemu.sample(guest, wl, {}, 1, 0, HostSettings())
    inner = json.loads(next(line for line in (s.output or "").splitlines()
                            if line.startswith("{")))
    st = inner["state"]
    assert st["memcg"] == "v2", st
    assert st["thp_backed_fraction"] == 1.0
    assert st["memcg_thp_fault_alloc"] >= 4          # 8 MiB: four PMDs, at least once
    assert st["memcg_pgfault"] > 0 and "memcg_swap_kb" in st
