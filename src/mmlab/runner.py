"""Run an experiment's schedule, one trial at a time, each committed as it ends.

For every trial: apply the arm's global settings (journaled), record the
environment as it then is, run the workload, restore the settings, and
commit the samples with the trial's status in one transaction.  Ctrl-C puts
the trial in flight back into the plan; SIGKILL leaves it 'running', which
`resume` also puts back.  Either way no finished trial is lost or repeated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import kernels, knobs, probe, workloads
from .errors import Interrupted, MmlabError
from .experiment import Arm, Plan
from .samples import Sample
from .store import Store, Trial
from .targets import host, qemu


@dataclass
class RunResult:
    done: int
    failed: int
    skipped: int


def check_consent(plan: Plan, allow_host_changes: bool) -> None:
    """Refuse before the first trial, naming the setting, unless allowed.
    Guest arms change only their own disposable kernel and need no consent."""
    allowed = allow_host_changes or plan.profile.host_changes
    host_arms = [a for a in plan.arms if not a.is_guest]
    if allowed or not host_arms:
        return
    wl = workloads.get(plan.profile.workload)
    if wl.host_settings:
        raise MmlabError(f"{wl.name} changes {wl.host_settings[0]} while it runs; set "
                         "host_changes = true in the profile or pass --allow-host-changes")
    for arm in host_arms:
        changes = arm.settings.changes()
        if changes:
            raise MmlabError(f"arm {arm.name} would change {changes[0]}; set host_changes = "
                             "true in the profile or pass --allow-host-changes")


def prepare_kernels(plan: Plan, say: Callable[[str], None]) -> dict[str, kernels.Kernel | str]:
    """Each guest kernel the plan names, fetched if it is a Debian one not yet
    cached; an error text in place of a kernel makes that kernel's trials fail."""
    out: dict[str, kernels.Kernel | str] = {}
    for name in sorted({a.kernel for a in plan.arms if a.is_guest}):
        try:
            out[name] = kernels.get(name)
        except MmlabError as missing:
            if not name.startswith("debian:"):
                out[name] = str(missing)
                continue
            say(f"fetching kernel {name} (apt-get download)")
            try:
                out[name] = kernels.add_debian(name.removeprefix("debian:"))
            except MmlabError as exc:
                out[name] = str(exc)
    return out


def _guest(arm: Arm, kernel: kernels.Kernel, plan: Plan) -> qemu.Guest:
    return qemu.Guest(kernel, vcpus=int(arm.cpus or 1), memory_mb=arm.memory_mb,
                      extra_cmdline=plan.profile.cmdline, timeout_s=plan.profile.timeout_s)


def _run_guest(arm: Arm, kernel: kernels.Kernel | str, plan: Plan,
               wl: workloads.Workload) -> tuple[list[Sample], dict]:
    if isinstance(kernel, str):
        raise MmlabError(kernel)
    guest = _guest(arm, kernel, plan)
    accel, why = qemu.accelerator(kernel, qemu.initramfs_cache())
    env = {**probe.environment(), **qemu.guest_environment(guest, accel, why)}
    try:
        samples = qemu.run(guest, wl, arm.params, plan.profile.samples_per_trial,
                           plan.profile.warmups, arm.settings)
    except MmlabError as exc:
        raise TrialError(str(exc), env) from exc
    return samples, env


class TrialError(MmlabError):
    """A failed trial, with the environment it failed in."""

    def __init__(self, message: str, environment: dict):
        super().__init__(message)
        self.environment = environment


def run(store: Store, exp_id: int, plan: Plan, allow_host_changes: bool,
        on_trial: Callable[[Trial, int, int], None] | None = None,
        say: Callable[[str], None] = print) -> RunResult:
    """Run every planned trial of `exp_id`; `on_trial(trial, index, total)` before each."""
    check_consent(plan, allow_host_changes)
    allowed = allow_host_changes or plan.profile.host_changes
    wl = workloads.get(plan.profile.workload)
    arms = {a.name: a for a in plan.arms}
    store.replan_interrupted(exp_id)
    pending = store.trials(exp_id, status="planned")
    total = len(store.trials(exp_id))
    skipped = total - len(pending)
    guest_kernels = prepare_kernels(plan, say) if pending else {}
    journal = knobs.Journal()
    done = failed = 0
    for trial in pending:
        if on_trial:
            on_trial(trial, skipped + done + failed, total)
        arm = arms[trial.arm]
        store.start_trial(trial.id)
        env = None
        try:
            if arm.is_guest:
                samples, env = _run_guest(arm, guest_kernels[arm.kernel], plan, wl)
            else:
                with journal.session():
                    knobs.apply(arm.settings, journal, allowed)
                    env = probe.environment()
                    samples = host.run(wl, arm.params, samples=plan.profile.samples_per_trial,
                                       warmups=plan.profile.warmups, journal=journal,
                                       cpus=arm.cpus)
        except Interrupted:
            store.replan_trial(trial.id)
            raise
        except MmlabError as exc:
            store.fail_trial(trial.id, str(exc), getattr(exc, "environment", env))
            failed += 1
            continue
        store.finish_trial(trial.id, samples, env)
        done += 1
    return RunResult(done, failed, skipped)


def attribute(store: Store, exp_id: int, plan: Plan, allow_host_changes: bool,
              say: Callable[[str], None] = print) -> int:
    """Attribution trials, after the timing trials, with each arm's settings
    applied: per host arm one run under perf, two under lock tracing and one
    counting tracepoints; per guest arm one instrumented boot.  Returns how
    many arms got attribution."""
    from .attribution import collect
    wl = workloads.get(plan.profile.workload)
    allowed = allow_host_changes or plan.profile.host_changes
    journal = knobs.Journal()
    stored = 0
    guest_kernels = prepare_kernels(plan, say)
    for arm in plan.arms:
        say(f"attribution: {arm.name}")
        if arm.is_guest:
            kernel = guest_kernels[arm.kernel]
            if isinstance(kernel, str):
                say(f"attribution: {arm.name} skipped: {kernel}")
                continue
            try:
                store.save_attribution(exp_id, arm.name, "guest_trace", collect.guest_trace(
                    wl, arm.params, _guest(arm, kernel, plan), arm.settings,
                    tuple(plan.profile.trace_count),
                    tuple(plan.profile.trace_time)))
                stored += 1
            except MmlabError as exc:
                say(f"attribution: {arm.name} failed: {exc}")
            continue
        with journal.session():
            knobs.apply(arm.settings, journal, allowed)
            store.save_attribution(exp_id, arm.name, "stacks",
                                   collect.perf_stacks(wl, arm.params, arm.cpus))
            contention = collect.lock_contention(wl, arm.params, arm.cpus)
            tracepoints = collect.tracepoint_counts(wl, arm.params, arm.cpus)
        if contention is not None:
            store.save_attribution(exp_id, arm.name, "locks", contention)
        if tracepoints is not None:
            store.save_attribution(exp_id, arm.name, "events", tracepoints)
        stored += 1
    return stored
