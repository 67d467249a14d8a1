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
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PREFIX = "mmlab-trial."
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)\.\d+$")
RMDIR_TRIES = 20          # a reaped process may still be leaving its group
RMDIR_WAIT_S = 0.05


@dataclass(frozen=True)
class Group:
    """The trial's group (`path`), or None and why there is none."""
    path: Path | None
    why: str = ""

    def enter(self) -> None:
        """Move the calling process into the group: a child's preexec_fn."""
        if self.path:
            (self.path / "cgroup.procs").write_text("0")

    def describe(self) -> str:
        return str(self.path) if self.path else f"none: {self.why}"


def parent(mountinfo: str, cgroup: str) -> tuple[Path | None, str]:
    """The memory cgroup the runner is in, as a directory, from the texts of
    /proc/self/mountinfo and /proc/self/cgroup; a v1 hierarchy with the
    memory controller first (the memory controller is then not on v2)."""
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
    for line in cgroup.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if v1 and "memory" in controllers.split(","):
            return Path(v1 + path.rstrip("/")), ""
        if not v1 and v2 and number == "0" and not controllers:
            return Path(v2 + path.rstrip("/")), ""
    return None, "no memory cgroup hierarchy in /proc/self/mountinfo and /proc/self/cgroup"


def sweep(where: Path) -> None:
    """Groups a killed run left behind (their runner is gone), removed."""
    for old in where.glob(PREFIX + "*"):
        found = _NAME.match(old.name)
        if found and not Path(f"/proc/{found[1]}").exists():
            with contextlib.suppress(OSError):
                old.rmdir()


_made = 0


def make(where: Path) -> Group:
    """A new empty group under `where`, or why there is none."""
    global _made
    _made += 1
    path = where / f"{PREFIX}{os.getpid()}.{_made}"
    try:
        path.mkdir()
    except OSError as exc:
        return Group(None, f"mkdir {path}: {exc.strerror}")
    if not (path / "memory.stat").exists():
        remove(path)
        return Group(None, f"{where} does not enable the memory controller for its "
                     "children (cgroup v2: a group holding processes cannot)")
    return Group(path)


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
def trial_group() -> Iterator[Group]:
    """A group of its own for one trial, removed after it (and after
    Ctrl-C); one left by a killed run is removed by the next."""
    try:
        where, why = parent(Path("/proc/self/mountinfo").read_text(),
                            Path("/proc/self/cgroup").read_text())
    except OSError as exc:
        where, why = None, f"reading /proc/self: {exc.strerror}"
    if where is None:
        yield Group(None, why)
        return
    sweep(where)
    group = make(where)
    try:
        yield group
    finally:
        if group.path:
            remove(group.path)
