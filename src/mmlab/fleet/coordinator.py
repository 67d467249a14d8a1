"""A fleet run: one experiment per machine, each looked after by the runner.

`create` stores the profile's plan once per machine (the same arms and the
same seeded, interleaved schedule; the machine and a fleet label in the
plan).  `run` runs every machine's experiment at once, each with
runner.run in a thread of its own, so the adaptive rounds, the looks and the
matched-state controls are the local ones, judged per machine.  Only the
trials of a look run differently: the machine is a Target (`MachineTarget`)
whose `run_trials` sends each to the machine's queue, where the machine's
worker claims, runs and commits it; it follows the store until the look's
trials have ended.

A trial whose worker is gone goes back to the plan and to the queue: its
worker was killed (no answer for LOST_S seconds), or answers but is not
running it.  Planned trials with no message left are sent again.  The
claim the worker took guards the rest: a worker that was only slow finds its
claim lost and counts nothing, so a trial is never counted twice, and never
left running or waiting forever.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mmlab import environ
from mmlab.errors import Interrupted, MmlabError
from mmlab.experiment.plan import Arm, Plan
from mmlab.fleet import engine, queue, registry
from mmlab.run import runner
from mmlab.run.events import OnEvent, saying
from mmlab.store import Store, Trial
from mmlab.targets import Announce, TargetPool

POLL_S = 0.5            # how often a machine's look reads its trials from the store
ROLL_CALL_S = 2.0       # how often the workers are asked what they run
LOST_S = 30            # a worker silent this long is taken for killed (MMLAB_FLEET_LOST_S)


def create(store: Store, plan: Plan, machines: list[str], allow_host_changes: bool) -> list[int]:
    """One experiment per machine, once every machine is registered and has
    checked the plan (`check`); returns their ids in machine order."""
    found = registered(store, machines)
    for name in machines:
        check(plan, allow_host_changes, found[name])
    label = secrets.token_hex(4)
    return [store.create_experiment(plan.model_copy(update={"machine": m, "fleet": label}))
            for m in machines]


def registered(store: Store, machines: list[str]) -> dict[str, registry.Registration]:
    """The machines, once the store is a fleet's shared one and each
    machine's worker registered in it: refused before anything is stored."""
    if store.dir is not None:
        raise MmlabError(f"--machines needs the fleet's shared store: --results "
                         f"postgresql://... (not {store.where})")
    return registry.lookup(store, machines)


def members(store: Store, exp_id: int) -> list[int]:
    """The experiments of the fleet run `exp_id` belongs to (just itself
    when it is not a fleet experiment)."""
    label = json.loads(store.experiment(exp_id)["plan"]).get("fleet")
    if label is None:
        return [exp_id]
    return [r["id"] for r in store.experiments()
            if json.loads(r["plan"]).get("fleet") == label]


def check(plan: Plan, allow_host_changes: bool, machine: registry.Registration) -> None:
    """What can be refused here, before anything is queued for `machine`:
    host changes not consented to (its host arms change its own settings);
    bare-metal arms for a machine whose worker drives no bare-metal machine,
    or that no bare-metal machine runs yet.  The rest of a bare-metal check
    (the base kernel, each kernel fetched) is the worker's, as it is a local
    run's target's: the machine is named on the worker (--bare-metal), never
    here, so this machine's $MMLAB_BARE_METAL means nothing to a fleet run."""
    from mmlab.targets import baremetal
    from mmlab.targets.host import HostTarget
    HostTarget(allow_host_changes).check(plan)
    if any(a.bare_metal for a in plan.arms):
        if machine.bare_metal is None:
            raise MmlabError(f"bare_metal = true: the worker of {machine.name} drives no "
                             f"bare-metal machine (on it: mmlab worker --name {machine.name} "
                             "--bare-metal MACHINE ...)")
        baremetal.refuse(plan)


class RollCall(threading.Thread):
    """Asks every ROLL_CALL_S which workers answer and which trials they run."""

    def __init__(self, celery: Any, stop: threading.Event):
        super().__init__(daemon=True, name="mmlab-fleet-roll-call")
        self.celery, self.stop = celery, stop
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.answered: dict[str, float] = {}              # node -> last answer (monotonic)
        self.views: list[tuple[float, dict[str, set[int]]]] = []   # (asked at, answers)
        self.lost_s = environ.seconds("MMLAB_FLEET_LOST_S", LOST_S)

    def run(self) -> None:
        while not self.stop.is_set():
            asked = time.monotonic()
            try:
                answers = engine.active(self.celery)
            except Exception:        # a broker hiccup: ask again next time
                answers = {}
            with self.lock:
                self.answered.update(dict.fromkeys(answers, asked))
                self.views = (self.views + [(asked, answers)])[-3:]
            self.stop.wait(ROLL_CALL_S)

    def silent_for(self, node: str) -> float:
        """Seconds since `node` last answered (since the roll call began if never)."""
        with self.lock:
            return time.monotonic() - self.answered.get(node, self.started)

    def orphaned(self, node: str, trial_id: int, running_since: float) -> str:
        """Why a trial first seen running at `running_since` has no worker
        running it, or "" while it may still have one."""
        with self.lock:
            later = [answers for asked, answers in self.views if asked > running_since]
        if len(later) >= 2 and all(node in a and trial_id not in a[node] for a in later):
            return f"its worker {node} is not running it"
        silent = self.silent_for(node)
        if min(silent, time.monotonic() - running_since) > self.lost_s:
            return f"its worker {node} has not answered for {silent:.0f} s"
        return ""

    def idle(self, node: str, since: float) -> bool:
        """Whether `node` answered, running nothing, in two looks after `since`."""
        with self.lock:
            later = [answers for asked, answers in self.views if asked > since]
        return len(later) >= 2 and all(node in a and not a[node] for a in later)


@dataclass
class MachineTarget:
    """A fleet machine as a Target: a look's trials are queued for its
    worker, followed in the store, and re-queued when the worker is gone."""
    celery: Any
    machine: registry.Registration
    allow_host_changes: bool
    roll_call: RollCall
    stop: threading.Event
    say: Callable[[str], None]
    sent: dict[int, str] = field(default_factory=dict)     # trial id -> task id
    told_silent: bool = False
    stalled_since: float | None = None

    @property
    def name(self) -> str:
        return f"fleet:{self.machine.name}"

    def check(self, plan: Plan) -> None:
        check(plan, self.allow_host_changes, self.machine)

    def attribute(self, arm: Arm, plan: Plan) -> dict[str, dict]:
        raise MmlabError("--attribute: attribution runs on one machine, not in fleet runs "
                         "(run the profile there with a results directory)")

    def run_trials(self, store: Store, exp_id: int, plan: Plan, pending: list[Trial],
                   announce: Announce) -> tuple[int, int]:
        ids = {t.id for t in pending}
        for trial in pending:
            self._send(exp_id, trial.id)
        announced: set[int] = set()
        running_since: dict[int, float] = {}
        while True:
            if self.stop.is_set():
                self._withdraw(store, exp_id)
                raise Interrupted
            trials = [t for t in store.trials(exp_id) if t.id in ids]
            for t in trials:
                if t.status != "planned" and t.id not in announced:
                    announce(t)
                    announced.add(t.id)
                if t.status == "running":
                    self._follow(store, exp_id, t, running_since)
                else:
                    running_since.pop(t.id, None)
            if all(t.status in ("done", "failed") for t in trials):
                return (sum(t.status == "done" for t in trials),
                        sum(t.status == "failed" for t in trials))
            self._tell_silence(sum(t.status == "planned" for t in trials))
            self._resend_lost(exp_id, trials)
            self.stop.wait(POLL_S)

    def _resend_lost(self, exp_id: int, trials: list[Trial]) -> None:
        """Planned trials whose messages are gone (a worker that failed before
        it claimed one, a broker restarted without its file) are sent again
        once the machine's queue is empty and its worker, answering, has run
        nothing in two looks since that was first seen.  A message sent twice
        runs its trial once: the second finds it claimed."""
        planned = [t for t in trials if t.status == "planned"]
        if not planned or any(t.status == "running" for t in trials) or \
                engine.queue_length(self.celery, self.machine.name):
            self.stalled_since = None
            return
        self.stalled_since = self.stalled_since or time.monotonic()
        if self.roll_call.idle(self.machine.node, self.stalled_since):
            self.say(f"{self.machine.name}: {len(planned)} planned trial(s) had no message "
                     "in its queue; sent again")
            for t in planned:
                self._send(exp_id, t.id)
            self.stalled_since = None

    def _tell_silence(self, waiting: int) -> None:
        """Say once that trials wait for a worker that does not answer."""
        silent = self.roll_call.silent_for(self.machine.node)
        if silent <= self.roll_call.lost_s:
            self.told_silent = False
        elif waiting and not self.told_silent:
            self.say(f"{self.machine.name}: its worker {self.machine.node} has not answered "
                     f"for {silent:.0f} s; {waiting} trial(s) wait in queue "
                     f"{queue(self.machine.name)} until one does "
                     f"(mmlab worker --name {self.machine.name})")
            self.told_silent = True

    def _follow(self, store: Store, exp_id: int, t: Trial, running_since: dict[int, float]) -> None:
        since = running_since.setdefault(t.id, time.monotonic())
        why = self.roll_call.orphaned(self.machine.node, t.id, since)
        if why and store.replan_trial(t.id):
            self.say(f"{self.machine.name}: trial {t.position} ({t.arm}) re-queued: {why}")
            running_since.pop(t.id)
            self._send(exp_id, t.id)

    def _send(self, exp_id: int, trial_id: int) -> None:
        try:
            self.sent[trial_id] = engine.send(self.celery, self.machine.name, exp_id, trial_id,
                                              self.allow_host_changes)
        except Exception as exc:      # kombu's own errors when the broker is gone
            raise MmlabError(f"{self.machine.name}: cannot queue trial {trial_id} ({exc})") from exc

    def _withdraw(self, store: Store, exp_id: int) -> None:
        """On Ctrl-C: the queued trials are revoked (they stay planned, for
        resume); a trial already running ends and is committed."""
        planned = {t.id for t in store.trials(exp_id, status="planned")}
        engine.revoke(self.celery, [task for trial, task in self.sent.items() if trial in planned])


def run(results: str, exp_ids: list[int], allow_host_changes: bool, with_controls: bool,
        on_event: OnEvent) -> dict[int, runner.RunResult]:
    """Run every machine's experiment at once until each is judged; Ctrl-C
    stops them all (queued trials revoked, planned ones kept for resume).
    `on_event` hears every machine's trials and looks, from its thread."""
    store = Store(results)
    plans = {e: store.plan(e) for e in exp_ids}
    machine_of = {e: _machine(e, p) for e, p in plans.items()}
    found = registry.lookup(store, list(machine_of.values()))
    store.close()
    celery = engine.app(next(iter(found.values())).broker)
    engine.reachable(celery)
    stop = threading.Event()
    watch = RollCall(celery, stop)
    watch.start()
    done: dict[int, runner.RunResult] = {}
    errors: list[BaseException] = []

    def machine_run(exp_id: int) -> None:
        machine = found[machine_of[exp_id]]
        mine = Store(results)
        say = saying(on_event)
        target = MachineTarget(celery, machine, allow_host_changes, watch, stop, say)
        try:
            done[exp_id] = runner.run(
                mine, exp_id, plans[exp_id],
                TargetPool(allow_host_changes, say, make=lambda arm: target),
                on_event, with_controls, machine.name)
        except BaseException as exc:       # re-raised by the coordinator's thread
            errors.append(exc)
            stop.set()
        finally:
            mine.close()

    threads = [threading.Thread(target=machine_run, args=(e,), daemon=True) for e in exp_ids]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join()
    real = [e for e in errors if not isinstance(e, Interrupted)]
    if real:
        raise real[0]
    if errors:
        raise Interrupted
    return done


def _machine(exp_id: int, plan: Plan) -> str:
    """The machine an experiment was planned on; a local one has none."""
    if plan.machine is None:
        raise MmlabError(f"experiment {exp_id} was not planned on a fleet machine (mmlab "
                         f"experiment resume {exp_id} runs it here)")
    return plan.machine
