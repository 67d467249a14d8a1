"""The store: experiments, arms, trials and samples, one SQLite file per lab
dir, or one PostgreSQL database a fleet of machines shares (backend.py).

WAL mode, and one transaction per finished trial (its samples and its status
together), so a crash loses at most the trial in flight and a reader never
sees half a trial.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmlab.errors import MmlabError
from mmlab.experiment.plan import Arm, Plan
from mmlab.experiment.schedule import slots
from mmlab.judge.measurements import Measurements, TrialSamples
from mmlab.judge.states import STATE_FUNCTIONS
from mmlab.store import backend
from mmlab.workloads.samples import Sample

SCHEMA = """
CREATE TABLE IF NOT EXISTS experiments (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    workload TEXT NOT NULL,
    profile_path TEXT NOT NULL,
    profile_text TEXT NOT NULL,
    profile_hash TEXT NOT NULL,
    seed INTEGER NOT NULL,
    created REAL NOT NULL,
    plan TEXT NOT NULL                  -- Plan JSON without arms and order (those are rows)
);
CREATE TABLE IF NOT EXISTS arms (
    id INTEGER PRIMARY KEY,
    experiment_id INTEGER NOT NULL REFERENCES experiments(id),
    name TEXT NOT NULL,
    position INTEGER NOT NULL,
    spec TEXT NOT NULL,                 -- the Arm as JSON
    UNIQUE (experiment_id, name)
);
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY,
    experiment_id INTEGER NOT NULL REFERENCES experiments(id),
    arm_id INTEGER NOT NULL REFERENCES arms(id),
    position INTEGER NOT NULL,          -- planned order, 0-based
    round INTEGER NOT NULL,
    slot INTEGER,                       -- position within its round, 0-based
    order_seed INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('planned', 'running', 'done', 'failed')),
    target TEXT NOT NULL,
    started REAL,
    ended REAL,
    environment TEXT,
    error TEXT,
    UNIQUE (experiment_id, position)
);
CREATE TABLE IF NOT EXISTS samples (
    id INTEGER PRIMARY KEY,
    trial_id INTEGER NOT NULL REFERENCES trials(id),
    idx INTEGER NOT NULL,
    raw TEXT NOT NULL                   -- the sample JSON exactly as validated
);
CREATE TABLE IF NOT EXISTS attributions (
    id INTEGER PRIMARY KEY,
    experiment_id INTEGER NOT NULL REFERENCES experiments(id),
    arm_id INTEGER NOT NULL REFERENCES arms(id),
    kind TEXT NOT NULL,                 -- stacks, locks
    data TEXT NOT NULL,
    created REAL NOT NULL,
    UNIQUE (experiment_id, arm_id, kind)
);
CREATE INDEX IF NOT EXISTS trials_by_experiment ON trials (experiment_id, position);
CREATE INDEX IF NOT EXISTS samples_by_trial ON samples (trial_id);
"""


@dataclass(frozen=True)
class Trial:
    id: int
    arm: str
    position: int
    round: int
    slot: int          # position within its round, 0-based
    status: str
    started: float | None
    ended: float | None
    error: str | None


def _trial(r: Mapping[str, Any]) -> Trial:
    return Trial(r["id"], r["arm"], r["position"], r["round"], r["slot"], r["status"],
                 r["started"], r["ended"], r["error"])


def status_counts(trials: list[Trial]) -> dict[str, int]:
    """How many trials are done, failed, planned and running."""
    return {st: sum(t.status == st for t in trials)
            for st in ("done", "failed", "planned", "running")}


# The tables a current store has (an older one is migrated as it is opened).
TABLES = re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", SCHEMA)


class Store:
    def __init__(self, results_dir: str | Path, create: bool = True, read_only: bool = False):
        """`results_dir`: a results directory, or a postgresql:// URL; with
        `create` False it must hold a store already; with `read_only` (the
        commands that only read) it is opened for reading, so a store in a
        read-only directory is read, unless it is an older one to migrate."""
        self.db = backend.connect(results_dir, SCHEMA, create, read_only)
        if self.db.read_only and not self._current():
            self.db.close()             # migrating writes: opened as a writing command does
            self.db = backend.connect(results_dir, SCHEMA, create=False)
        self.dir = self.db.dir          # the lab directory; None for PostgreSQL
        self.where = self.db.where      # for messages (a URL without its password)
        if "plan" not in self.db.columns("experiments"):
            raise MmlabError(f"{self.where}: written by an older mmlab that did not "
                             "store plans; use a new --results directory")
        if "slot" not in self.db.columns("trials"):
            self._add_slots()

    def _current(self) -> bool:
        """Whether the store has every table and column a migration adds."""
        return all(self.db.columns(t) for t in TABLES) and "slot" in self.db.columns("trials")

    def _add_slots(self) -> None:
        """Migrate a store written before trials kept their position within
        the round: add the column and fill it from the planned order.  The
        rounds of matched-state controls are numbered like their arms' but
        planned after them, so each is counted apart."""
        with self.db.transaction():
            self.db.add_column("trials", "slot INTEGER")
            controls = {r["id"] for r in self.db.execute("SELECT id, spec FROM arms")
                        if json.loads(r["spec"]).get("control_of")}
            rows = self.db.execute("SELECT id, experiment_id, arm_id, round FROM trials "
                                   "ORDER BY experiment_id, position").fetchall()
            groups: dict[tuple, list[Mapping[str, Any]]] = {}
            for r in rows:
                groups.setdefault((r["experiment_id"], r["arm_id"] in controls), []).append(r)
            self.db.executemany("UPDATE trials SET slot=? WHERE id=?", [
                (slot, r["id"]) for group in groups.values()
                for r, slot in zip(group, slots([(r["round"], "") for r in group]))])

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------ writing

    def create_experiment(self, plan: Plan) -> int:
        """Store the plan, its arms and the planned order; returns the ID."""
        p = plan.profile
        with self.db.transaction():
            exp_id = self.db.execute(
                "INSERT INTO experiments (name, workload, profile_path, profile_text, "
                "profile_hash, seed, created, plan) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (p.name, p.workload, plan.path, plan.text, plan.profile_hash, p.seed, time.time(),
                 plan.model_dump_json(exclude={"arms", "order"}))).fetchone()["id"]
            for pos, arm in enumerate(plan.arms):
                self.db.execute(
                    "INSERT INTO arms (experiment_id, name, position, spec) VALUES (?, ?, ?, ?)",
                    (exp_id, arm.name, pos, arm.model_dump_json()))
            self._add_trials(exp_id, plan, plan.order)
        return exp_id

    def _add_trials(self, exp_id: int, plan: Plan, order: list[tuple[int, str]]) -> None:
        """Append `order` to the experiment's planned trials (inside a transaction)."""
        arm_ids = {r["name"]: r["id"] for r in self.db.execute(
            "SELECT id, name FROM arms WHERE experiment_id=?", (exp_id,))}
        start = self.db.execute("SELECT COUNT(*) AS n FROM trials WHERE experiment_id=?",
                                (exp_id,)).fetchone()["n"]
        self.db.executemany(
            "INSERT INTO trials (experiment_id, arm_id, position, round, slot, order_seed, "
            "status, target) VALUES (?, ?, ?, ?, ?, ?, 'planned', ?)",
            [(exp_id, arm_ids[name], start + i, rnd, slot, plan.profile.seed,
              plan.arm(name).target)
             for i, ((rnd, name), slot) in enumerate(zip(order, slots(order)))])

    def extend(self, exp_id: int, plan: Plan, order: list[tuple[int, str]]) -> None:
        """Add rounds to a stored plan: `order` (round, arm) appended as planned
        trials in one transaction, so the plan grows whole or not at all."""
        with self.db.transaction():
            self._add_trials(exp_id, plan, order)

    def add_arms(self, exp_id: int, plan: Plan, arms: list[Arm],
                 order: list[tuple[int, str]]) -> Plan:
        """Add arms (matched-state controls) and their planned trials to a
        stored experiment in one transaction; returns the plan as now stored."""
        with self.db.transaction():
            for pos, arm in enumerate(arms, len(plan.arms)):
                self.db.execute(
                    "INSERT INTO arms (experiment_id, name, position, spec) VALUES (?, ?, ?, ?)",
                    (exp_id, arm.name, pos, arm.model_dump_json()))
            self._add_trials(exp_id, plan.model_copy(update={"arms": plan.arms + arms}), order)
        return self.plan(exp_id)

    def set_limits(self, exp_id: int, max_repetitions: int | None = None,
                   budget_s: float | None = None) -> Plan:
        """Change the stored plan's maximum rounds or time budget (command-line
        overrides on resume); returns the plan as now stored."""
        row = self.experiment(exp_id)
        stored = json.loads(row["plan"])
        update = {k: v for k, v in (("max_repetitions", max_repetitions),
                                    ("budget_s", budget_s)) if v is not None}
        if update:
            plan = self.plan(exp_id)
            profile = plan.profile.model_validate({**plan.profile.model_dump(), **update})
            stored["profile"] = json.loads(profile.model_dump_json())
            with self.db.transaction():
                self.db.execute("UPDATE experiments SET plan=? WHERE id=?",
                                (json.dumps(stored), exp_id))
        return self.plan(exp_id)

    def start_trial(self, trial_id: int) -> float | None:
        """Take a planned trial; returns the claim (its start time), or None
        when it was not planned (another worker has it, or it is finished)."""
        started = time.time()
        with self.db.transaction():
            taken = self.db.execute("UPDATE trials SET status='running', started=? "
                                    "WHERE id=? AND status='planned'", (started, trial_id))
            return started if taken.rowcount == 1 else None

    def _ended(self, trial_id: int, claim: float | None, sets: str, args: tuple) -> bool:
        """End a trial (inside a transaction); with a claim, only if the trial
        still runs under it: a fleet worker whose trial was re-queued while it
        seemed lost cannot count it a second time."""
        fence = " AND status='running' AND started=?" if claim is not None else ""
        return self.db.execute(f"UPDATE trials SET {sets} WHERE id=?{fence}",
                               (*args, trial_id, *(() if claim is None else (claim,)))
                               ).rowcount == 1

    def finish_trial(self, trial_id: int, samples: list[Sample], environment: dict,
                     claim: float | None = None) -> bool:
        """Samples and status in one transaction: the trial is kept whole or
        not at all; False when its claim was lost (nothing is written)."""
        with self.db.transaction():
            if not self._ended(trial_id, claim, "status='done', ended=?, environment=?",
                               (time.time(), json.dumps(environment))):
                return False
            self.db.executemany("INSERT INTO samples (trial_id, idx, raw) VALUES (?, ?, ?)",
                                [(trial_id, i, s.model_dump_json()) for i, s in enumerate(samples)])
            return True

    def fail_trial(self, trial_id: int, error: str, environment: dict | None = None,
                   claim: float | None = None) -> bool:
        with self.db.transaction():
            return self._ended(trial_id, claim, "status='failed', ended=?, error=?, environment=?",
                               (time.time(), error,
                                json.dumps(environment) if environment else None))

    def replan_trial(self, trial_id: int) -> bool:
        """An interrupted (or orphaned) running trial goes back to the plan, to
        run again; False when it was not running any more."""
        with self.db.transaction():
            return self.db.execute("UPDATE trials SET status='planned', started=NULL "
                                   "WHERE id=? AND status='running'", (trial_id,)).rowcount == 1

    def replan_interrupted(self, exp_id: int) -> int:
        with self.db.transaction():
            return self.db.execute("UPDATE trials SET status='planned', started=NULL "
                                   "WHERE experiment_id=? AND status='running'",
                                   (exp_id,)).rowcount

    def save_attribution(self, exp_id: int, arm: str, kind: str, data: dict) -> None:
        with self.db.transaction():
            arm_id = self.db.execute("SELECT id FROM arms WHERE experiment_id=? AND name=?",
                                     (exp_id, arm)).fetchone()["id"]
            self.db.execute("INSERT INTO attributions (experiment_id, arm_id, kind, data, "
                            "created) VALUES (?, ?, ?, ?, ?) ON CONFLICT (experiment_id, arm_id, "
                            "kind) DO UPDATE SET data=excluded.data, created=excluded.created",
                            (exp_id, arm_id, kind, json.dumps(data), time.time()))

    # ------------------------------------------------------------ reading

    def attributions(self, exp_id: int) -> dict[str, dict[str, dict]]:
        """{arm: {kind: data}} for every attribution stored."""
        out: dict[str, dict[str, dict]] = {}
        for r in self.db.execute("SELECT a.name, t.kind, t.data FROM attributions t JOIN arms a "
                                 "ON a.id=t.arm_id WHERE t.experiment_id=?", (exp_id,)):
            out.setdefault(r["name"], {})[r["kind"]] = json.loads(r["data"])
        return out

    def attributed_at(self, exp_id: int) -> float | None:
        """When the experiment's last attribution was stored (None: none
        was): `make bench-check` tells attribution's time from its trials'."""
        row = self.db.execute("SELECT MAX(created) AS last FROM attributions WHERE "
                              "experiment_id=?", (exp_id,)).fetchone()
        return None if row["last"] is None else float(row["last"])

    def plan(self, exp_id: int) -> Plan:
        """The plan as it was stored: arms from their rows, the order from the
        trials (which adaptive rounds may have extended)."""
        row = self.experiment(exp_id)
        arms = [Arm.model_validate_json(r["spec"]) for r in self.db.execute(
            "SELECT spec FROM arms WHERE experiment_id=? ORDER BY position", (exp_id,))]
        order = [(t.round, t.arm) for t in self.trials(exp_id)]
        return Plan.model_validate({**json.loads(row["plan"]), "arms": arms, "order": order})

    def experiment(self, exp_id: int) -> Mapping[str, Any]:
        row = self.db.execute("SELECT * FROM experiments WHERE id=?", (exp_id,)).fetchone()
        if row is None:
            raise MmlabError(f"no experiment {exp_id} in {self.where}")
        return row

    def experiments(self) -> list[Mapping[str, Any]]:
        return self.db.execute(
            "SELECT e.*, "
            "(SELECT COUNT(*) FROM trials t WHERE t.experiment_id=e.id) AS trials, "
            "(SELECT COUNT(*) FROM trials t WHERE t.experiment_id=e.id AND status='done') AS done, "
            "(SELECT COUNT(*) FROM trials t WHERE t.experiment_id=e.id AND status='failed') "
            "AS failed "
            "FROM experiments e ORDER BY e.id").fetchall()

    def trials(self, exp_id: int, status: str | None = None) -> list[Trial]:
        sql = ("SELECT t.*, a.name AS arm FROM trials t JOIN arms a ON a.id=t.arm_id "
               "WHERE t.experiment_id=?")
        args: list = [exp_id]
        if status:
            sql += " AND t.status=?"
            args.append(status)
        rows = self.db.execute(sql + " ORDER BY t.position", args).fetchall()
        return [_trial(r) for r in rows]

    def trial(self, exp_id: int, trial_id: int) -> Trial | None:
        """One trial of an experiment (what a fleet worker's message names)."""
        row = self.db.execute("SELECT t.*, a.name AS arm FROM trials t JOIN arms a ON "
                              "a.id=t.arm_id WHERE t.experiment_id=? AND t.id=?",
                              (exp_id, trial_id)).fetchone()
        return None if row is None else _trial(row)

    def environments(self, exp_id: int) -> list[dict]:
        rows = self.db.execute("SELECT environment FROM trials WHERE experiment_id=? AND "
                               "environment IS NOT NULL ORDER BY position", (exp_id,)).fetchall()
        return [json.loads(r["environment"]) for r in rows]

    def measurements(self, exp_id: int) -> Measurements:
        """Every finished trial's samples with its round and position, and how
        far the plan has got: what verdicts, the paired analysis and the
        adaptive runner need, from one query of the samples."""
        arms = [r["name"] for r in self.db.execute(
            "SELECT name FROM arms WHERE experiment_id=? ORDER BY position", (exp_id,))]
        trials = self.trials(exp_id)
        grouped: dict[int, list[Sample]] = {}
        for r in self.db.execute(
                "SELECT s.trial_id, s.raw FROM samples s JOIN trials t ON t.id=s.trial_id "
                "WHERE t.experiment_id=? ORDER BY t.position, s.idx", (exp_id,)):
            grouped.setdefault(r["trial_id"], []).append(Sample.model_validate_json(r["raw"]))
        finished = [t for t in trials if t.status in ("done", "failed")]
        functions = {r["name"]: json.loads(r["data"]) for r in self.db.execute(
            "SELECT a.name, t.data FROM attributions t JOIN arms a ON a.id=t.arm_id "
            "WHERE t.experiment_id=? AND t.kind=?", (exp_id, STATE_FUNCTIONS))}
        return Measurements(
            arms=arms,
            trials=[TrialSamples(t.arm, t.round, t.position, tuple(grouped[t.id]), t.slot)
                    for t in trials if t.id in grouped],
            rounds=max((t.round for t in trials), default=-1) + 1,
            pending=sum(t.status in ("planned", "running") for t in trials),
            seconds=sum(t.ended - t.started for t in finished if t.started and t.ended),
            finished=len(finished), functions=functions)

    def samples_by_arm(self, exp_id: int) -> dict[str, list[Sample]]:
        """Every stored sample, grouped by arm, in arm order."""
        return self.measurements(exp_id).by_arm
