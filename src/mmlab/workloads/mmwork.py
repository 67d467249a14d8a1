"""The mmwork command line, and running it as a child of this process.

Every target starts mmwork with the arguments `argv` builds (the host as a
child here, a guest from its /trial.sh).  On the host its stdout is read
line by line so that each sample reaches the caller as soon as it is
printed.  The global settings the workload itself touches (KSM for
ksm-rmap) are journaled first, so that a SIGKILLed mmwork cannot leave them
changed.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress

from mmlab.errors import Interrupted, MmlabError
from mmlab.machine import knobs, memcg
from mmlab.workloads import Workload
from mmlab.workloads.build import mmwork_path
from mmlab.workloads.samples import Sample, parse_line


class TrialFailed(MmlabError):
    """mmwork exited non-zero or was killed; carries its stderr tail."""


@contextmanager
def _guard_workload_settings(workload: Workload, journal: knobs.Journal) -> Iterator[None]:
    """Journal the setting files the workload declares it changes (its
    notes, like "(trigger)", are not files), for the block.  The journal
    takes only settings mmlab manages: a workload declaring any other file
    is refused here, before it runs."""
    files = [path for path in workload.host_settings if path.startswith("/") and " " not in path]
    with journal.session():
        for path in files:
            journal.record_file(path)
        yield


def parse_cpus(text: str) -> set[int]:
    """'0-1,3' -> {0, 1, 3}; a bare count '2' -> the first two usable CPUs.
    Checked against the CPUs this process may use."""
    online = os.sched_getaffinity(0)
    if text.isdigit():
        if int(text) > len(online):
            raise MmlabError(f"cpus = {text}: only {len(online)} CPUs are available")
        return set(sorted(online)[:int(text)])
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    if not cpus <= online:
        raise MmlabError(f"cpus = {text!r}: CPU {min(cpus - online)} is not available "
                         f"(have {sorted(online)})")
    return cpus


def argv(workload: Workload, params: Mapping[str, object], samples: int,
         warmups: int | None = None, binary: str | None = None,
         own_memcg: bool = False) -> list[str]:
    """mmwork's arguments for one trial; `binary` is its path where it runs,
    `own_memcg` that it starts in a memory cgroup of the trial's own.  The
    workload's own come last: an exec workload's end with its command."""
    out = [binary or str(mmwork_path()), workload.name, "--samples", str(samples)]
    out += ["--warmups", str(warmups)] if warmups is not None else []
    out += ["--own-memcg"] if own_memcg else []
    return out + workload.args(params)


def sample(workload: Workload, params: Mapping[str, object], samples: int,
           warmups: int | None = None,
           journal: knobs.Journal | None = None, cpus: str | None = None,
           on_sample: Callable[[Sample], None] | None = None,
           prefix: list[str] | None = None,
           group: memcg.TrialCgroups | None = None) -> list[Sample]:
    """Run `samples` measured samples in one mmwork process here and return them.

    `cpus` ("0-1,3") pins mmwork and its workers to those CPUs; `group`
    starts it in the trial's own memory cgroup, which it then reads around
    each sample; `prefix` wraps it (e.g. `perf record ... --`) for
    attribution runs.  Whatever it started is ended when it exits (`_run`)."""
    journal = journal or knobs.Journal()
    own = group is not None and group.path is not None
    command = [*(prefix or []), *argv(workload, params, samples, warmups, own_memcg=own)]
    cpuset = parse_cpus(cpus) if cpus else None
    with ExitStack() as stack:
        trial = group or stack.enter_context(memcg.trial_group(count=False))
        with _guard_workload_settings(workload, journal):
            got, stderr, rc = _run(command, workload, trial, cpuset, on_sample)
    if rc:
        tail = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {rc}"
        raise TrialFailed(tail if rc == 2 else f"{workload.name} failed: {tail}")
    if len(got) != samples:
        raise TrialFailed(f"{workload.name}: expected {samples} samples, got {len(got)}")
    return got


def _run(command: list[str], workload: Workload, group: memcg.TrialCgroups, cpuset: set[int] | None,
         on_sample: Callable[[Sample], None] | None) -> tuple[list[Sample], str, int]:
    """mmwork run in `group` and in a process group of its own, its samples
    read as it prints them; (samples, stderr, exit status).  However it
    ends (done, failed, Ctrl-C), what it started is ended after it: the
    cgroup whole (a `setsid` daemon included), and its process group, killed
    while mmwork's exit keeps that group's id from being reused."""
    def start() -> None:
        """In the child, before mmwork: its groups, then its CPUs."""
        group.enter()       # nothing where no group could be made
        if cpuset:
            os.sched_setaffinity(0, cpuset)

    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=start, process_group=0)
    got: list[Sample] = []
    try:
        Interrupted.raise_if_received()     # one that came while the child was made
        assert proc.stdout is not None
        for line in proc.stdout:
            sample = workload.measured(parse_line(line))
            got.append(sample)
            if on_sample:
                on_sample(sample)
        stderr = proc.stderr.read() if proc.stderr else ""
        _exited(proc)
    except BaseException:
        # Ctrl-C or an error of ours: let mmwork restore its settings first.
        proc.send_signal(signal.SIGTERM)
        _exited(proc)
        raise
    finally:
        if proc.returncode is None:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        group.end()
        proc.wait()
    return got, stderr, proc.returncode


def _exited(proc: subprocess.Popen) -> None:
    """Wait for mmwork to exit without reaping it (its pid stays its own)."""
    if proc.returncode is None:
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
