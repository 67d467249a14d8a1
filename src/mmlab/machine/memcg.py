"""A memory cgroup of its own for each host trial, so that what the trial
reads about faults, THP and swap is its own and not the machine's.

On a shared machine `/proc/vmstat` counts every process: a neighbour's THP
faults land in one arm's samples and not the other's.  A trial's processes
(mmwork, its workers, an exec workload's command) charge the group they
run in, so the runner makes one under the group it runs in itself, starts
mmwork inside it (`--own-memcg` tells mmwork to read its memory.stat
around each sample), and removes it after the trial.  The group has no
limit: it only counts.

cgroup v1 (a hierarchy with the memory controller) lets any group hold
children; its memory.stat has the fault counters and the THP and swap in
use, not THP events.  cgroup v2 gives a child memory.stat only where the
parent enables the memory controller for its children, which no group
holding processes but the root may; where no group can be had, the trial
runs as before and its environment says why.

The same trial has a cgroup v2 group of its own for ending it (`kill`; the
memory group itself on a v2 machine): every process it starts (mmwork, its
workers, an exec command and whatever that forks, a `setsid` daemon
included) is in it, so writing cgroup.kill after the trial (after success,
failure and Ctrl-C alike) ends them all; a run killed before it could is
ended by the next run's sweep.  A kernel without cgroup.kill (before 5.14)
gets SIGKILL for each process in the group until it is empty, and where no
group can be made at all mmwork.py falls back to its process group, which a
`setsid` descendant leaves.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PREFIX = "mmlab-trial."
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)\.\d+$")
RMDIR_TRIES = 20          # a reaped process may still be leaving its group
RMDIR_WAIT_S = 0.05
END_TRIES = 100           # a killed process leaves its group as it exits: 5 s at most


@dataclass(frozen=True)
class TrialCgroups:
    """The trial's memory group (`path`, or None and `why` there is none)
    and the group that ends its processes (`kill`: cgroup v2, `path` itself
    on a v2 machine; None where none could be made)."""
    path: Path | None
    why: str = ""
    kill: Path | None = None

    def dirs(self) -> list[Path]:
        """The groups a trial's process joins: one, two (v1 memory and v2),
        or none."""
        return list(dict.fromkeys(p for p in (self.path, self.kill) if p))

    def enter(self) -> None:
        """Move the calling process into the groups: a child's preexec_fn."""
        for path in self.dirs():
            (path / "cgroup.procs").write_text("0")

    def end(self) -> None:
        """Every process still in the groups killed, and gone when this returns."""
        for path in self.dirs():
            end(path)

    def describe(self) -> str:
        return str(self.path) if self.path else f"none: {self.why}"


def _mounts(mountinfo: str) -> tuple[str | None, str | None]:
    """Where the v1 hierarchy with the memory controller and cgroup2 are
    mounted, from /proc/self/mountinfo's text."""
    v1 = v2 = None
    for line in mountinfo.splitlines():
        head, _, tail = line.partition(" - ")
        fields, sup = head.split(), tail.split()
        if len(fields) < 5 or len(sup) < 3:
            continue
        if sup[0] == "cgroup" and "memory" in sup[2].split(","):
            v1 = fields[4]
        elif sup[0] == "cgroup2" and v2 is None:
            v2 = fields[4]
    return v1, v2


def unified(mountinfo: str, cgroup: str) -> Path | None:
    """The cgroup v2 group the runner is in, as a directory, or None where
    cgroup2 is not mounted."""
    _, v2 = _mounts(mountinfo)
    for line in cgroup.splitlines():
        if v2 and line.startswith("0::"):
            return Path(v2 + line[3:].rstrip("/"))
    return None


def parent(mountinfo: str, cgroup: str) -> tuple[Path | None, str]:
    """The memory cgroup the runner is in, as a directory, from the texts of
    /proc/self/mountinfo and /proc/self/cgroup; a v1 hierarchy with the
    memory controller first (the memory controller is then not on v2)."""
    v1, _ = _mounts(mountinfo)
    for line in cgroup.splitlines():
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if v1 and "memory" in controllers.split(","):
            return Path(v1 + path.rstrip("/")), ""
    found = None if v1 else unified(mountinfo, cgroup)
    if found:
        return found, ""
    return None, "no memory cgroup hierarchy in /proc/self/mountinfo and /proc/self/cgroup"


def sweep(where: Path) -> None:
    """Groups a killed run left behind (their runner is gone): what still
    runs in them ended, and the groups removed."""
    for old in where.glob(PREFIX + "*"):
        found = _NAME.match(old.name)
        if found and not Path(f"/proc/{found[1]}").exists():
            end(old)
            with contextlib.suppress(OSError):
                old.rmdir()


_made = 0


def make(where: Path) -> tuple[Path | None, str]:
    """A new empty group under `where`, or why there is none."""
    global _made
    _made += 1
    path = where / f"{PREFIX}{os.getpid()}.{_made}"
    try:
        path.mkdir()
    except OSError as exc:
        return None, f"mkdir {path}: {exc.strerror}"
    return path, ""


def groups(mountinfo: str, cgroup: str, count: bool = True) -> TrialCgroups:
    """The trial's groups, made: a memory group under the runner's when
    `count` (v1, or v2 where the parent gives its children the memory
    controller) and a v2 group to end it by.  On v2 one group is both."""
    where, why = parent(mountinfo, cgroup) if count else (None, "not asked for")
    v2 = unified(mountinfo, cgroup)
    for found in dict.fromkeys(p for p in (where, v2) if p):
        sweep(found)
    kill, kill_why = make(v2) if v2 else (None, "no cgroup2 mount")
    if where is not None and where == v2:
        if kill and (kill / "memory.stat").exists():
            return TrialCgroups(kill, "", kill)
        return TrialCgroups(None, kill_why or f"{where} does not enable the memory controller for "
                     "its children (cgroup v2: a group holding processes cannot)", kill)
    path, why = make(where) if where else (None, why)
    if path and not (path / "memory.stat").exists():
        remove(path)
        path, why = None, f"{where}: no memory.stat in a group made there"
    return TrialCgroups(path, why, kill)


def end(path: Path) -> None:
    """Every process in the group killed (cgroup.kill, or SIGKILL to each
    until none is left where the kernel has no cgroup.kill), waiting until
    the group is empty; a group already gone is nothing to end."""
    procs = path / "cgroup.procs"
    try:
        if (path / "cgroup.kill").exists():
            (path / "cgroup.kill").write_text("1")
        for _ in range(END_TRIES):
            pids = [int(pid) for pid in procs.read_text().split()]
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(RMDIR_WAIT_S)
    except FileNotFoundError:
        return


def remove(path: Path) -> None:
    """The group removed once its last process has left it.  One that a
    straggler keeps for a second is left, empty, for the next run's sweep:
    never a reason to lose the trial that ran in it."""
    for _ in range(RMDIR_TRIES):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(RMDIR_WAIT_S)


@contextlib.contextmanager
def trial_group(count: bool = True) -> Iterator[TrialCgroups]:
    """Groups of its own for one trial (a memory group only when `count`),
    whose processes are ended and which are removed after it, after Ctrl-C
    too; those of a killed run are ended and removed by the next."""
    try:
        group = groups(Path("/proc/self/mountinfo").read_text(),
                       Path("/proc/self/cgroup").read_text(), count)
    except OSError as exc:
        group = TrialCgroups(None, f"reading /proc/self: {exc.strerror}")
    try:
        yield group
    finally:
        group.end()
        for path in group.dirs():
            remove(path)
