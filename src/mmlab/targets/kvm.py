"""A KVM guest run as the tuning guides run one (QEMU's cpu-models(7), the
RHEL virtualisation tuning guide): `-cpu host`, guest memory preallocated
(from the host's 2 MiB hugetlb pages where enough are free), and each vCPU
thread pinned to a host CPU of its own with QEMU's other threads kept apart
from them, so that a vCPU is never migrated, nor shares its CPU with the
emulator, while a trial runs.

QEMU 7.2 has no option to pin vCPUs; with `-name ...,debug-threads=on` it
names each vCPU thread "CPU N/KVM", which is how `pin` finds them in
/proc/PID/task once they exist.  None of this applies under TCG, whose
vCPUs are host threads doing emulation, not hardware guests.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

HUGEPAGES = Path("/dev/hugepages")
FREE_2M = Path("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
VCPU_THREAD = re.compile(r"CPU (\d+)/KVM")
PIN_WAIT_S = 10.0        # vCPU threads appear within a second of QEMU's start


def args(memory_mb: int, numa_nodes: int) -> list[str]:
    """KVM's part of the QEMU command line: the host CPU model, thread names
    for pinning, and the guest's memory preallocated, hugetlb-backed where
    the host has the pages free (one NUMA node; nodes preallocate their
    own backends, boot.numa_args)."""
    out = ["-accel", "kvm", "-cpu", "host", "-name", "mmlab,debug-threads=on"]
    if numa_nodes > 1:
        return out
    if hugetlb_backed(memory_mb):
        out += ["-mem-path", str(HUGEPAGES)]
    return [*out, "-mem-prealloc"]


def hugetlb_backed(memory_mb: int) -> bool:
    """Can the guest's memory come from the host's free 2 MiB hugetlb pages?"""
    return hugetlb_free_mb() >= memory_mb and os.path.ismount(HUGEPAGES)


def hugetlb_free_mb() -> int:
    try:
        return int(FREE_2M.read_text()) * 2
    except (OSError, ValueError):
        return 0


def memory(memory_mb: int, numa_nodes: int) -> str:
    """How the guest's memory is backed, in words, for its environment."""
    if numa_nodes > 1:
        return "preallocated per NUMA node"
    return "preallocated, 2 MiB hugetlb pages" if hugetlb_backed(memory_mb) else "preallocated"


def placement(vcpus: int, cpus: set[int]) -> tuple[dict[int, int], set[int]]:
    """vCPU -> host CPU, and the CPUs left for QEMU's other threads: the
    vCPUs get the highest CPUs this process may use, one each, and the
    emulator the rest (all of them when the vCPUs take every CPU)."""
    ordered = sorted(cpus, reverse=True)
    mine = {v: ordered[v % len(ordered)] for v in range(vcpus)}
    rest = set(cpus) - set(mine.values())
    return mine, rest or set(cpus)


def pin(proc: subprocess.Popen, vcpus: int) -> threading.Thread:
    """Pin the guest's vCPU threads and keep QEMU's other threads off their
    CPUs, from a thread that waits for the vCPUs to exist (returned, for
    tests to join); a QEMU that exits first is left alone."""
    def run() -> None:
        cpus = os.sched_getaffinity(0)
        mine, rest = placement(vcpus, cpus)
        deadline = time.monotonic() + PIN_WAIT_S
        while time.monotonic() < deadline and proc.poll() is None:
            threads = _threads(proc.pid)
            found = {int(m.group(1)): tid for tid, name in threads.items()
                     if (m := VCPU_THREAD.fullmatch(name))}
            if len(found) >= vcpus:
                _apply(threads, found, mine, rest)
                return
            time.sleep(0.05)
    t = threading.Thread(target=run, name="mmlab-kvm-pin", daemon=True)
    t.start()
    return t


def _threads(pid: int) -> dict[int, str]:
    out = {}
    for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
        try:
            out[int(task.name)] = (task / "comm").read_text().strip()
        except OSError:
            continue            # a thread that ended meanwhile
    return out


def _apply(threads: dict[int, str], vcpu_tids: dict[int, int], mine: dict[int, int],
           rest: set[int]) -> None:
    for tid in threads:
        try:
            os.sched_setaffinity(tid, rest)
        except OSError:
            continue
    for v, tid in vcpu_tids.items():
        try:
            os.sched_setaffinity(tid, {mine[v]})
        except OSError:
            continue
