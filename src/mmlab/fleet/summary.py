"""What a fleet run found, machine by machine, and what the fleet is doing.

Each machine's verdicts come from its own experiment (verdicts.judge over
that machine's trials only); the summary only lines them up: for each
metric and pair, on which machines the change reproduced.  Read from the
store, so it also works after `mmlab store copy` into a lab directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mmlab.fleet import engine, registry
from mmlab.judge import verdicts
from mmlab.judge.comparison import Comparison
from mmlab.store import Store


@dataclass(frozen=True)
class Reproduction:
    """One metric and pair across the machines; `emulated`: the machines
    where its figures are emulated time (a TCG guest's clock, a simulated
    bare-metal machine's), which every rendering says."""
    metric: str
    arm: str
    baseline: str
    by_machine: dict[str, Comparison]
    emulated: set[str] = field(default_factory=set)

    @property
    def reproduced_on(self) -> list[str]:
        """Machines where the verdict is a change (regression or improvement)."""
        return [m for m, c in self.by_machine.items() if c.verdict.changed]


@dataclass(frozen=True)
class FleetSummary:
    fleet: str | None
    experiments: dict[str, int]            # machine -> experiment id
    classes: dict[str, str]                # machine -> what it is (probe or environment)
    rows: list[Reproduction]


def summarize(store: Store, exp_ids: list[int]) -> FleetSummary:
    """Every machine's own verdicts, side by side."""
    experiments, classes = {}, {}
    rows: dict[tuple[str, str, str], Reproduction] = {}
    known = registry.machines(store) if store.dir is None else {}
    for exp_id in exp_ids:
        plan = store.plan(exp_id)
        machine = plan.machine or "this machine"
        experiments[machine] = exp_id
        classes[machine] = (known[machine].describe() if machine in known
                            else _environment_class(store.environments(exp_id)))
        judged = verdicts.judge(plan, store.measurements(exp_id))
        for c in judged.comparisons:
            key = (c.metric, c.arm, c.baseline)
            row = rows.setdefault(key, Reproduction(*key, {}))
            row.by_machine[machine] = c
            if judged.emulated_time(plan, c):
                row.emulated.add(machine)
    fleet = json.loads(store.experiment(exp_ids[0])["plan"]).get("fleet")
    return FleetSummary(fleet, experiments, classes, list(rows.values()))


def _environment_class(environments: list[dict]) -> str:
    """A machine's class from a stored trial environment (no registry: a
    copy): the bare-metal machine its trials ran on, or the host."""
    if not environments:
        return "no trial ran"
    e = environments[0]
    if e.get("target") == "bare-metal":
        return f"{e.get('machine')} by kexec ({e.get('accelerator')})"
    return f"{e.get('cpus')} x {e.get('cpu_model')}, kernel {e.get('kernel')}"


@dataclass(frozen=True)
class MachineStatus:
    machine: registry.Registration
    answering: bool
    queued: int | None                     # messages in its queue (None: broker unknown)
    running: list[tuple[int, Any]]         # (experiment id, Trial) running on it
    planned: int                           # trials of unfinished experiments not started


def status(store: Store) -> list[MachineStatus]:
    """Every registered machine: does its worker answer, what waits in its
    queue, what it runs, what is planned for it."""
    machines = registry.machines(store)
    pending = _pending_by_machine(store)
    answers: dict[str, set[int]] = {}
    queued: dict[str, int | None] = {}
    for broker in {m.broker for m in machines.values()}:
        celery = engine.app(broker)
        try:
            engine.reachable(celery)
        except Exception:
            queued.update({n: None for n, m in machines.items() if m.broker == broker})
            continue
        answers.update(engine.active(celery))
        queued.update({n: engine.queue_length(celery, n) for n, m in machines.items()
                       if m.broker == broker})
    out = []
    for name, m in machines.items():
        trials = pending.get(name, [])
        out.append(MachineStatus(m, m.node in answers, queued.get(name),
                                 [(e, t) for e, t in trials if t.status == "running"],
                                 sum(t.status == "planned" for _, t in trials)))
    return out


def _pending_by_machine(store: Store) -> dict[str, list[tuple[int, Any]]]:
    """Planned and running trials of unfinished fleet experiments, by machine."""
    out: dict[str, list[tuple[int, Any]]] = {}
    for r in store.experiments():
        if r["done"] + r["failed"] == r["trials"]:
            continue
        machine = json.loads(r["plan"]).get("machine")
        if machine:
            out.setdefault(machine, []).extend(
                (r["id"], t) for t in store.trials(r["id"]) if t.status in ("planned", "running"))
    return out
