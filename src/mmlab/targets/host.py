"""The running kernel as a target: the arm's global settings are applied
through the journal before each trial and restored after it, the
environment is recorded as it then is, and mmwork runs as a child."""

from __future__ import annotations

from mmlab.attribution import collect
from mmlab.errors import MmlabError
from mmlab.experiment.plan import Arm, Plan
from mmlab.machine import knobs, memcg
from mmlab.targets import LocalTarget, TrialError, TrialResult, probe
from mmlab.workloads import insns, mmwork
from mmlab.workloads.samples import Sample


def consented(plan: Plan, allow_changes: bool) -> bool:
    """May the plan change this machine's global settings: the profile's
    host_changes or --allow-host-changes?"""
    return allow_changes or plan.profile.host_changes


def refuse(arm: Arm, settings: knobs.HostSettings, allowed: bool) -> None:
    """Refuse, naming the arm, what `settings` cannot do here, consent or
    not (a CPU clock without cpufreq, a governor the CPUs lack), and what
    it may not (a change not consented to)."""
    try:
        settings.clock_files()
    except MmlabError as exc:
        raise MmlabError(f"arm {arm.name}: {exc}") from exc
    changes = [] if allowed else settings.changes()
    if changes:
        raise MmlabError(f"arm {arm.name} would change {changes[0]}; set host_changes = "
                         "true in the profile or pass --allow-host-changes")


class HostTarget(LocalTarget):
    name = "host"

    def __init__(self, allow_changes: bool = False):
        self.allow_changes = allow_changes
        self.journal = knobs.Journal()

    def _allowed(self, plan: Plan) -> bool:
        return consented(plan, self.allow_changes)

    def check(self, plan: Plan) -> None:
        """Refuse before the first trial: CPUs this machine does not have, a
        CPU clock it cannot set, and global changes not consented to, naming
        the arm and setting."""
        arms = [a for a in plan.arms if a.kernel == "host"]
        for arm in arms:
            if arm.cpus:
                try:
                    mmwork.parse_cpus(arm.cpus)
                except MmlabError as exc:
                    raise MmlabError(f"arm {arm.name}: {exc}") from exc
        wl = plan.workload
        if wl.host_settings and arms and not self._allowed(plan):
            raise MmlabError(f"{wl.name} changes {wl.host_settings[0]} while it runs; set "
                             "host_changes = true in the profile or pass --allow-host-changes")
        for arm in arms:
            refuse(arm, arm.settings, self._allowed(plan))

    def run_trial(self, arm: Arm, plan: Plan) -> TrialResult:
        """The arm's settings applied, its mmwork run in a memory cgroup of
        the trial's own (memcg.py), every process it started ended with the
        group, the settings restored."""
        env = None
        with self.journal.session(), memcg.trial_group() as group:
            try:
                knobs.apply(arm.settings, self.journal, self._allowed(plan))
                env = {**probe.environment(), "trial_memcg": group.describe()}
                if insns.only(plan.workload, plan.profile.metrics):
                    return TrialResult(insns.alone(self._counting_pass(arm, plan, group),
                                                   plan.workload), env)
                samples = mmwork.sample(plan.workload, arm.params,
                                        samples=plan.profile.samples_per_trial,
                                        warmups=plan.profile.warmups, journal=self.journal,
                                        cpus=arm.cpus, group=group)
                if insns.wanted(plan.workload, plan.profile.metrics):
                    insns.add_counts(samples, plan.workload,
                                     lambda: self._counting_pass(arm, plan, group))
            except MmlabError as exc:
                raise TrialError(str(exc), env) from exc
        return TrialResult(samples, env)

    def _counting_pass(self, arm: Arm, plan: Plan, group: memcg.TrialCgroups) -> list[Sample]:
        """The trial again in an mmwork of its own that reads the CPU's
        instruction counters around each window (insns.py), settings as set."""
        ok, why = insns.perf_status()
        if not ok:
            raise insns.Unavailable(why)
        return mmwork.sample(plan.workload, insns.counting_params(arm.params),
                             samples=plan.profile.samples_per_trial, warmups=plan.profile.warmups,
                             journal=self.journal, cpus=arm.cpus, group=group)

    def attribute(self, arm: Arm, plan: Plan) -> dict[str, dict]:
        """One run under perf, two under lock tracing, one counting
        tracepoints, each its own mmwork process with the arm's settings
        (those of them the profile's `attribution` asks for)."""
        wl, params, cpus = plan.workload, arm.params, arm.cpus
        wanted = set(plan.profile.attribution) or {"stacks", "locks", "events"}
        found: dict[str, dict | None] = {}
        with self.journal.session():
            knobs.apply(arm.settings, self.journal, self._allowed(plan))
            if "stacks" in wanted:
                found["stacks"] = collect.perf_stacks(wl, params, cpus)
            if wanted & {"locks", "events"}:
                tf = knobs.Tracefs().mount(self.journal)
                if "locks" in wanted:
                    found["locks"] = collect.lock_contention(wl, params, cpus, tf)
                if "events" in wanted:
                    found["events"] = collect.tracepoint_counts(wl, params, cpus, tf)
        return {kind: data for kind, data in found.items() if data is not None}
