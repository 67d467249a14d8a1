"""Run an experiment's schedule, one trial at a time, each committed as it ends.

For every trial the arm's target applies the arm's settings, records the
environment as it then is, runs the workload, restores the settings and
commits the samples with the trial's status in one transaction
(targets.run_one).  The runner never asks where a trial runs: it hands each
look's trials, in their planned order, to their targets.  Ctrl-C puts
the trial in flight back into the plan; SIGKILL leaves it 'running', which
`resume` also puts back.  Either way no finished trial is lost or repeated.

`repetitions` rounds come first; after them, and after every later look,
the verdicts decide whether rounds are added (see verdicts.judge).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from mmlab.errors import Interrupted, MmlabError
from mmlab.experiment.plan import Arm, Plan
from mmlab.experiment.schedule import schedule
from mmlab.judge import controls, states, verdicts
from mmlab.judge.measurements import Measurements
from mmlab.run.events import Looked, Message, OnEvent, TrialStarting, ignore
from mmlab.store import Store, Trial
from mmlab.targets import TargetPool, run_counting_side_by_side, run_side_by_side
from mmlab.workloads.samples import Sample


@dataclass
class RunResult:
    """What a run did, and the last look's judgement of the plan as it ended
    (with the matched-state controls it added), so nothing is judged twice."""
    done: int
    failed: int
    skipped: int
    plan: Plan
    measured: Measurements
    judgement: verdicts.Judgement
    added: int = 0             # rounds this run added after the planned looks

    @property
    def rounds(self) -> int:
        """Rounds in the plan at the end."""
        return self.measured.rounds

    @property
    def stopped(self) -> str:
        """Why no more rounds were added."""
        return self.judgement.stopped

    @property
    def controls(self) -> int:
        """Matched-state control arms in the plan."""
        return len([a for a in self.plan.arms if a.control_of])


def run(store: Store, exp_id: int, plan: Plan, pool: TargetPool, on_event: OnEvent = ignore,
        with_controls: bool = True, machine: str = "") -> RunResult:
    """Run every planned trial of `exp_id`, then judge; while a judged pair is
    undecided and the profile's maximum rounds and time budget allow, append
    the rounds of the next planned look (one transaction) and run them.
    When the rounds end with pairs the audit found in different page states,
    their matched-state controls (controls.py) are added as arms and run the
    same way, unless `with_controls` is False.
    `on_event` hears each trial as it starts and each look (naming
    `machine`, a fleet's, when given).  Everything it decides is derived
    from the store, so an interrupted run resumes where it stopped, also in
    the middle of added rounds.  Commands reach this through
    driver.run_experiment."""
    pool.check(plan)
    store.replan_interrupted(exp_id)
    done = failed = added = 0
    skipped: int | None = None
    names = [a.name for a in plan.arms]
    while True:
        pending = store.trials(exp_id, status="planned")
        total = len(store.trials(exp_id))
        if skipped is None:
            skipped = total - len(pending)
        ran, lost = run_look(store, exp_id, plan, pool, pending,
                             _announcer(on_event, skipped + done + failed, total, machine))
        done += ran
        failed += lost
        measured = store.measurements(exp_id)
        judged = verdicts.judge(plan, measured)
        on_event(Looked(judged, machine))
        if judged.next_rounds is None:
            extra = (_controls(store, exp_id, plan, pool, judged, measured.rounds, on_event)
                     if with_controls else [])
            if not extra:
                return RunResult(done, failed, skipped, plan, measured, judged, added)
            plan = store.plan(exp_id)
            names = [a.name for a in plan.arms]
            continue
        store.extend(exp_id, plan, schedule(names, judged.next_rounds, plan.profile.seed,
                                            start=measured.rounds))
        added += judged.next_rounds - measured.rounds


def _announcer(on_event: OnEvent, first: int, total: int,
               machine: str) -> Callable[[Trial], None]:
    """TrialStarting for each trial, its index counted on from `first`."""
    index = itertools.count(first)
    return lambda trial: on_event(TrialStarting(trial, next(index), total, machine))


def run_look(store: Store, exp_id: int, plan: Plan, pool: TargetPool, pending: list[Trial],
             announce: Callable[[Trial], None]) -> tuple[int, int]:
    """The pending trials in their planned order, each run of consecutive
    trials on one target handed to it whole (a fleet machine queues them),
    or, where every target here can run the plan's trials several at a time,
    that many at once, or, where they can run that many trials' counting
    passes at once, those together after the trials' timed passes."""
    width = pool.side_by_side(plan, pending)
    if width > 1:
        return run_side_by_side(store, plan, pending, pool, width, announce)
    width = pool.counting_side_by_side(plan, pending)
    if width > 1:
        return run_counting_side_by_side(store, plan, pending, pool, width, announce)
    done = failed = 0
    for target, trials in itertools.groupby(pending, key=lambda t: pool.target(plan.arm(t.arm))):
        ran, lost = target.run_trials(store, exp_id, plan, list(trials), announce)
        done += ran
        failed += lost
    return done, failed


def _controls(store: Store, exp_id: int, plan: Plan, pool: TargetPool,
              judged: verdicts.Judgement, rounds: int, on_event: OnEvent) -> list:
    """Add the matched-state controls `judged` calls for, with as many rounds
    as the arms they control, interleaved among themselves; returns them.
    Controls a target refuses (a host change not consented to) are skipped
    with a word, never silently."""
    extra = controls.derive(plan, judged.findings)
    if not extra:
        return []
    grown = plan.model_copy(update={"arms": plan.arms + extra})
    try:
        pool.check(grown)
    except MmlabError as exc:
        on_event(Message(f"matched-state controls not run: {exc}"))
        return []
    on_event(Message("matched-state controls: " + ", ".join(a.name for a in extra)))
    order = schedule([a.name for a in extra], rounds, plan.profile.seed + len(plan.arms))
    store.add_arms(exp_id, plan, extra, order)
    return extra


def attribute(store: Store, exp_id: int, plan: Plan, pool: TargetPool,
              on_event: OnEvent = ignore) -> int:
    """Attribution trials, after the timing trials, each arm's by its own
    target, as many arms at once as every target allows (instruction counts
    by function alone, in TCG guests: two here); stored on this thread;
    returns how many arms got attribution."""
    stored = 0
    samples = store.samples_by_arm(exp_id)
    for arm, found in zip(plan.arms, _attributions(plan, pool, on_event, samples), strict=True):
        if isinstance(found, MmlabError):
            on_event(Message(f"attribution: {arm.name} failed: {found}"))
        elif not found:
            on_event(Message(f"attribution: {arm.name}: nothing its target can attribute"))
        else:
            for kind, data in found.items():
                store.save_attribution(exp_id, arm.name, kind, data)
            stored += 1
    return stored


def _attributions(plan: Plan, pool: TargetPool, on_event: OnEvent,
                  samples: dict[str, list[Sample]]) -> list[dict[str, dict] | MmlabError]:
    """Each arm's attribution, or why it failed: one arm after another, each
    said as it starts, or as many at once as the targets allow, said before
    they start (events stay on this thread), their guests ended on Ctrl-C;
    each saved boot counted by function only where the arm's stored
    `samples` show its boots disagree (states.attribution_plan)."""
    def one(arm: Arm) -> dict[str, dict] | MmlabError:
        try:
            return pool.target(arm).attribute(
                arm, states.attribution_plan(plan, samples.get(arm.name, [])))
        except MmlabError as exc:
            return exc

    def said(arm: Arm) -> Arm:
        on_event(Message(f"attribution: {arm.name}"))
        return arm
    width = pool.attribution_side_by_side(plan)
    if width == 1:
        return [one(said(arm)) for arm in plan.arms]
    arms = [said(arm) for arm in plan.arms]
    with ThreadPoolExecutor(width, thread_name_prefix="attribution") as workers:
        try:
            return list(workers.map(one, arms))
        except Interrupted:
            pool.stop(plan)
            raise
