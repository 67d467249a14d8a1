"""A command's census: started here, its whole process tree read at moments
while it runs, and reported at its peak (the moment whose largest group was
largest).  A program builds and drops VMAs as it goes (a JVM's heap grows
and shrinks, a database forks backends), so a census taken once, at the
start or the end, would miss the moment a KSM walk would be longest.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from mmlab.census import groups, iterator, take
from mmlab.census.iterator import Vma
from mmlab.census.records import Census, CommandCensus, Moment
from mmlab.errors import MmlabError
from mmlab.workloads.build import built

KSM = "/sys/kernel/mm/ksm"


def tree(vmas: list[Vma], roots: set[int]) -> set[int]:
    """`roots` and every process descended from them, by the parents the
    iterator read with the VMAs (one consistent view, no /proc walk)."""
    children: dict[int, set[int]] = {}
    for v in vmas:
        children.setdefault(v.ppid, set()).add(v.tgid)
    out, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo += children.get(pid, [])
    return out


class Moments:
    """A process tree read at moments, keeping the census of the peak: the
    moment whose largest group, counted over all the tree's processes (a
    forked server's children share their parent's root), was largest."""

    def __init__(self, roots: set[int], top: int, patterns: bool = True):
        self.roots, self.top, self.patterns = roots, top, patterns
        self.t0 = time.monotonic()
        self.taken: list[Moment] = []
        self.peak: Census | None = None
        self.peak_at_s, self.peak_largest = 0.0, -1

    def read(self) -> None:
        """One census here, now."""
        t0 = time.perf_counter()
        self.add(time.monotonic() - self.t0, iterator.read(), t0, ksm_sharing())

    def add(self, at_s: float, everyone: list[Vma], t0: float,
            ksm: int | None = None) -> None:
        """The moment of `everyone`'s VMAs (every process's, read at
        `at_s`, the reading started at perf_counter `t0`); `ksm`: the pages
        KSM shared then, if ksmd ran."""
        pids = tree(everyone, self.roots)
        vmas = [v for v in everyone if v.tgid in pids]
        largest = max(groups.root_sizes(vmas).values(), default=0)
        self.taken.append(Moment(at_s=at_s, processes=len({v.tgid for v in vmas}),
                                 vmas=len(vmas), largest_group=largest,
                                 ksm_pages_sharing=ksm))
        if vmas and largest > self.peak_largest:
            self.peak = take.of(everyone, pids, self.top, t0, strict=False,
                                patterns=self.patterns)
            self.peak_at_s, self.peak_largest = at_s, largest

    def result(self, argv: list[str], code: int, seconds: float,
               output: str = "") -> CommandCensus:
        if self.peak is None:
            raise MmlabError(f"{' '.join(argv)}: exited before the first census could see it")
        return CommandCensus(command=argv, exit_code=code, seconds=seconds, output=output,
                             moments=self.taken, peak_at_s=self.peak_at_s, peak=self.peak)


def ksm_sharing() -> int | None:
    """The pages KSM shares on this machine (pages_sharing), or None when
    ksmd is not running: a KSM recipe's moments show that merging happened."""
    try:
        if Path(KSM, "run").read_text().strip() != "1":
            return None
        return int(Path(KSM, "pages_sharing").read_text())
    except (OSError, ValueError):
        return None


def survey(argv: list[str], interval_s: float = 0.5, top: int = 5,
           also: Iterable[int] = frozenset(),
           timeout_s: float | None = None) -> CommandCensus:
    """Start `argv`, read its tree (and the trees of `also`, a recipe's
    services) every `interval_s` until it exits, and return the peak.  The
    command runs under `mmcensus --hold`, which takes one more census as it
    exits, its mm still whole: a program shorter than the first reading (or
    one the reading was late for, on a busy machine) is seen all the same.
    A command that cannot start or fails is an error naming it; its process
    group is killed on the way out."""
    _runnable(argv[0])
    with tempfile.TemporaryDirectory(prefix="mmlab-census-") as tmp, \
            tempfile.TemporaryFile("w+") as log:
        held = Path(tmp, "held")
        child = subprocess.Popen([str(built("mmcensus")), "--hold", str(held), "--", *argv],
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        try:
            moments = Moments({_held_pid(held, child, argv, log), *also}, top)
            code = _follow(child, moments, interval_s, timeout_s, argv)
        finally:
            stop(child)
        if code:
            raise MmlabError(f"{' '.join(argv)}: exited with status {code}: {_last_words(log)}")
        moments.add(time.monotonic() - moments.t0, _at_exit(held), time.perf_counter(),
                    ksm_sharing())
        output = _last_words(log)
    return moments.result(argv, code, time.monotonic() - moments.t0, output)


def _runnable(program: str) -> None:
    """A program that cannot be run is named before anything starts."""
    found = shutil.which(program)
    if found is None:
        why = "no such program" if "/" not in program or not os.path.exists(program) \
            else "not executable"
        raise MmlabError(f"{program}: cannot run: {why}")


def _held_pid(held: Path, child: subprocess.Popen, argv: list[str], log) -> int:
    """The command's PID, which mmcensus writes first once it traces it.
    The file is read once more after mmcensus is seen gone: on a busy
    machine a short command may have run and ended between two looks."""
    while True:
        gone = child.poll() is not None
        with contextlib.suppress(FileNotFoundError):
            first, newline, _ = held.read_text().partition("\n")
            if newline:
                return int(first.removeprefix("pid "))
        if gone:
            raise MmlabError(f"{' '.join(argv)}: could not start: {_last_words(log)}")
        time.sleep(0.01)


def _at_exit(held: Path) -> list[Vma]:
    """The census mmcensus took at the command's exit (every process's)."""
    return iterator.parse(held.read_text().split("\n", 1)[1])


def _follow(child: subprocess.Popen, moments: Moments, interval_s: float,
            timeout_s: float | None, argv: list[str]) -> int:
    """Read the tree until the child exits; its exit status."""
    while child.poll() is None:
        if timeout_s is not None and time.monotonic() - moments.t0 > timeout_s:
            raise MmlabError(f"{' '.join(argv)}: still running after {timeout_s:g} s")
        next_at = time.monotonic() + interval_s
        moments.read()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(max(0.0, next_at - time.monotonic()))
    return child.returncode


def stop(child: subprocess.Popen, grace_s: float = 10) -> None:
    """End the child's whole process group (it was started in a session of
    its own): SIGTERM first, so that a database shuts down cleanly and
    leaves no shared memory behind, SIGKILL after `grace_s`; then reap it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _group_alive(child):
            time.sleep(0.05)
        if not _group_alive(child):
            break
    child.wait()


def _group_alive(child: subprocess.Popen) -> bool:
    child.poll()
    try:
        os.killpg(child.pid, 0)
    except ProcessLookupError:
        return False
    return True


def _last_words(log, lines: int = 3) -> str:
    log.seek(0)
    tail = log.read().strip().splitlines()[-lines:]
    return " | ".join(line.strip() for line in tail) or "(no output)"
