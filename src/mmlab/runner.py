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

from . import knobs, probe, workloads
from .errors import Interrupted, MmlabError
from .experiment import Plan
from .store import Store, Trial
from .targets import host


@dataclass
class RunResult:
    done: int
    failed: int
    skipped: int


def check_consent(plan: Plan, allow_host_changes: bool) -> None:
    """Refuse before the first trial, naming the setting, unless allowed."""
    allowed = allow_host_changes or plan.profile.host_changes
    if allowed:
        return
    wl = workloads.get(plan.profile.workload)
    if wl.host_settings:
        raise MmlabError(f"{wl.name} changes {wl.host_settings[0]} while it runs; set "
                         "host_changes = true in the profile or pass --allow-host-changes")
    for arm in plan.arms:
        changes = arm.settings.changes()
        if changes:
            raise MmlabError(f"arm {arm.name} would change {changes[0]}; set host_changes = "
                             "true in the profile or pass --allow-host-changes")


def run(store: Store, exp_id: int, plan: Plan, allow_host_changes: bool,
        on_trial: Callable[[Trial, int, int], None] | None = None) -> RunResult:
    """Run every planned trial of `exp_id`; `on_trial(trial, index, total)` before each."""
    check_consent(plan, allow_host_changes)
    allowed = allow_host_changes or plan.profile.host_changes
    wl = workloads.get(plan.profile.workload)
    arms = {a.name: a for a in plan.arms}
    store.replan_interrupted(exp_id)
    pending = store.trials(exp_id, status="planned")
    total = len(store.trials(exp_id))
    skipped = total - len(pending)
    journal = knobs.Journal()
    done = failed = 0
    for trial in pending:
        if on_trial:
            on_trial(trial, skipped + done + failed, total)
        arm = arms[trial.arm]
        store.start_trial(trial.id)
        env = None
        try:
            with journal.session():
                knobs.apply(arm.settings, journal, allowed)
                env = probe.environment()
                samples = host.run(wl, arm.params, samples=plan.profile.samples_per_trial,
                                   warmups=plan.profile.warmups, journal=journal, cpus=arm.cpus)
        except Interrupted:
            store.replan_trial(trial.id)
            raise
        except MmlabError as exc:
            store.fail_trial(trial.id, str(exc), env)
            failed += 1
            continue
        store.finish_trial(trial.id, samples, env)
        done += 1
    return RunResult(done, failed, skipped)
