"""`mmlab worker --name NAME`: the worker of one lab machine.

It registers the machine's probe and the identity of the kernel cache it
reads (`mmlab check` sends its built kernels only to workers that read its
own) in the shared store, then consumes the machine's own queue with one
pool process, so the machine runs one trial at a time.  For each message
it takes (claims) the trial in the store, runs it with the targets a local
run uses (host settings journaled and restored on this machine, guests
booted here) and commits it as it ends: the trial's result never waits in
the broker or in a coordinator.

A trial this machine's worker finds `running` when it takes the message was
orphaned by a worker killed mid-trial (only this worker runs this machine's
trials, and it is free): it goes back to the plan and runs now.  Settings
that killed worker left changed are restored from the journal before the
next trial, as every `mmlab` start does.

A worker started with `--bare-metal MACHINE` drives that bare-metal machine
(LKP's test box) from a host at the other end of its serial line, never from
the box's own base kernel, which every kexec ends: its bare-metal arms run
there, through one BareMetalTarget whatever the experiment.  The machine
stays up while trials wait in the queue, as across a local run's batch, and
is stopped when the queue is empty after a trial, or when the worker ends.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from mmlab.errors import MmlabError
from mmlab.experiment.plan import Arm, Plan
from mmlab.fleet import engine, machine_name, queue, registry
from mmlab.machine import knobs
from mmlab.store import Store, backend
from mmlab.targets import LocalTarget, TargetPool, run_one
from mmlab.targets.baremetal import BareMetalTarget

# (host changes allowed, arm) -> the target that arm's trials run in on this machine
MakeTarget = Callable[[bool, Arm], LocalTarget]


@dataclass
class Worker:
    """What a pool process needs to run the machine's trials; made before the
    pool forks, the store connection after (one per process)."""
    name: str
    results: str
    make_target: MakeTarget | None = None     # None: the machine's own host and guests
    bare_metal: BareMetalTarget | None = None  # the bare-metal machine it drives, if any
    queued: Callable[[], int] | None = None   # trials waiting in its queue (None: not asked)
    _store: Store | None = None
    _pools: dict[bool, TargetPool] = field(default_factory=dict)
    _plans: dict[int, Plan] = field(default_factory=dict)
    _checked: set[tuple[int, bool, int]] = field(default_factory=set)

    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self.results)
        return self._store

    def handle(self, exp_id: int, trial_id: int, allow_host_changes: bool) -> str:
        """One message: the trial run and committed, or why not, in words."""
        try:
            return self._handle(self.store(), exp_id, trial_id, allow_host_changes)
        except Exception:
            self._store = None      # a broken connection is not reused
            raise

    def _handle(self, store: Store, exp_id: int, trial_id: int, allow: bool) -> str:
        trial = store.trial(exp_id, trial_id)
        if trial is None:
            return f"skipped: experiment {exp_id} has no trial {trial_id}"
        plan = self._plan(store, exp_id, trial.arm)
        if plan.machine != self.name:
            return f"skipped: experiment {exp_id} runs on {plan.machine}, not {self.name}"
        if trial.status == "running":
            store.replan_trial(trial.id)         # orphaned by a killed worker of this machine
        pool = self._pool(allow)
        try:
            knobs.replay_orphaned()
            self._check(plan, pool, exp_id, allow)
        except MmlabError as exc:       # this machine cannot run it: the trial fails, visibly
            claim = store.start_trial(trial.id)
            if claim is not None:
                store.fail_trial(trial.id, str(exc), None, claim)
            return f"failed: {exc}"
        target = pool.target(plan.arm(trial.arm))
        assert isinstance(target, LocalTarget)      # a worker's pool makes local targets only
        outcome = run_one(store, trial, plan, target)
        if not self._waiting():
            target.release()
        return {True: "done", False: "failed", None: "skipped: not planned"}[outcome]

    def _waiting(self) -> bool:
        """Whether trials wait in the machine's queue, so that what its
        target keeps up (a bare-metal machine) is kept for them; a broker
        that does not answer keeps it too, until the next trial asks again.
        Not asked (no bare-metal machine): each trial is a batch of its own."""
        if self.queued is None:
            return False
        try:
            return self.queued() > 0
        except Exception:      # kombu raises its transport's own errors
            return True

    def release(self) -> None:
        """The bare-metal machine stopped: the worker's pool process ends."""
        if self.bare_metal is not None:
            self.bare_metal.release()

    def _plan(self, store: Store, exp_id: int, arm: str) -> Plan:
        """The experiment's plan, read again only when it has grown an arm
        (matched-state controls): rounds added later change nothing a trial uses."""
        plan = self._plans.get(exp_id)
        if plan is None or arm not in {a.name for a in plan.arms}:
            plan = self._plans[exp_id] = store.plan(exp_id)
        return plan

    def _pool(self, allow: bool) -> TargetPool:
        """The machine's targets, one pool per consent, kept between trials."""
        if allow not in self._pools:
            make = self.make_target
            self._pools[allow] = TargetPool(allow, make=(lambda arm: make(allow, arm)) if make
                                            else None, bare_metal=self.bare_metal)
        return self._pools[allow]

    def _check(self, plan: Plan, pool: TargetPool, exp_id: int, allow: bool) -> None:
        """The plan's targets check it on this machine, once per experiment
        and arms (consent for host changes, a guest kernel fetched here)."""
        key = (exp_id, allow, len(plan.arms))
        if key not in self._checked:
            pool.check(plan)
            self._checked.add(key)


def node(name: str) -> str:
    """The worker's Celery node name."""
    return f"{name}@{socket.gethostname()}"


def serve(name: str, results: str, broker: str, make_target: MakeTarget | None = None,
          loglevel: str = "WARNING", bare_metal: str | None = None) -> None:
    """Register this machine and consume its queue until stopped (SIGTERM
    waits for the trial in flight).  `bare_metal` names the bare-metal
    machine it drives, checked (its base kernel at hand) before it registers."""
    from mmlab.targets import baremetal, probe
    machine_name(name)
    if not backend.is_url(results):
        raise MmlabError(f"--results {results}: a worker needs the fleet's shared store, a "
                         "postgresql:// URL")
    box = baremetal.machine(print, bare_metal) if bare_metal else None
    if box is not None:
        box.base()
    celery = engine.app(broker)
    engine.reachable(celery)
    me = node(name)
    if me in engine.active(celery):
        raise MmlabError(f"a worker named {name} already answers as {me}: one worker per machine")
    cache = registry.kernel_cache()     # before the store: a bad MMLAB_KERNEL_CACHE stores nothing
    store = Store(results)
    registry.register(store, name, me, broker, {
        **probe.machine(), **cache,
        **(registry.bare_metal(box.name, box.accelerator) if box else {})})
    store.close()
    # the queue is asked after a trial only where a bare-metal machine is kept up for it
    worker = Worker(name, results, make_target, BareMetalTarget(box) if box else None,
                    (lambda: engine.queue_length(celery, name)) if box else None)
    celery.task(name=engine.TASK)(worker.handle)
    engine.on_process_exit(worker.release)
    print(f"mmlab worker {name}: queue {queue(name)} on {backend.redacted(broker)}, "
          f"store {backend.redacted(results)}"
          + (f", bare-metal machine {box.name}" if box else ""), flush=True)
    celery.worker_main(["worker", "--queues", queue(name), "--concurrency", "1",
                        "--pool", "prefork", "--hostname", me, "--prefetch-multiplier", "1",
                        "--without-gossip", "--without-mingle", "--without-heartbeat",
                        "--loglevel", loglevel])
