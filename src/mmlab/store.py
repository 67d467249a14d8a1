"""SQLite store: experiments, arms, trials and samples, one file per lab dir.

WAL mode, and one transaction per finished trial (its samples and its status
together), so a crash loses at most the trial in flight and a reader never
sees half a trial.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import MmlabError
from .samples import Sample

SCHEMA = """
CREATE TABLE IF NOT EXISTS experiments (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    workload TEXT NOT NULL,
    profile_path TEXT NOT NULL,
    profile_text TEXT NOT NULL,
    profile_hash TEXT NOT NULL,
    seed INTEGER NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS arms (
    id INTEGER PRIMARY KEY,
    experiment_id INTEGER NOT NULL REFERENCES experiments(id),
    name TEXT NOT NULL,
    position INTEGER NOT NULL,
    spec TEXT NOT NULL,
    UNIQUE (experiment_id, name)
);
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY,
    experiment_id INTEGER NOT NULL REFERENCES experiments(id),
    arm_id INTEGER NOT NULL REFERENCES arms(id),
    position INTEGER NOT NULL,          -- planned order, 0-based
    round INTEGER NOT NULL,
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
    status: str
    started: float | None
    ended: float | None
    error: str | None


def status_counts(trials: list[Trial]) -> dict[str, int]:
    """How many trials are done, failed, planned and running."""
    return {st: sum(t.status == st for t in trials)
            for st in ("done", "failed", "planned", "running")}


class Store:
    def __init__(self, results_dir: str | Path):
        self.dir = Path(results_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.dir / "mmlab.sqlite", isolation_level=None, timeout=30)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------ writing

    def create_experiment(self, plan) -> int:
        """Store the profile, its arms and the planned order; returns the ID."""
        p = plan.profile
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            cur = self.db.execute(
                "INSERT INTO experiments (name, workload, profile_path, profile_text, "
                "profile_hash, seed, created) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (p.name, p.workload, plan.path, plan.text, plan.profile_hash, p.seed, time.time()))
            exp_id = cur.lastrowid
            targets = {a.name: f"qemu:{a.kernel}" if a.is_guest else "host" for a in plan.arms}
            arm_ids = {}
            for pos, arm in enumerate(plan.arms):
                arm_ids[arm.name] = self.db.execute(
                    "INSERT INTO arms (experiment_id, name, position, spec) VALUES (?, ?, ?, ?)",
                    (exp_id, arm.name, pos, json.dumps(arm.spec()))).lastrowid
            self.db.executemany(
                "INSERT INTO trials (experiment_id, arm_id, position, round, order_seed, status, "
                "target) VALUES (?, ?, ?, ?, ?, 'planned', ?)",
                [(exp_id, arm_ids[name], pos, rnd, p.seed, targets[name])
                 for pos, (rnd, name) in enumerate(plan.order)])
        return exp_id

    def start_trial(self, trial_id: int) -> None:
        with self.db:
            self.db.execute("UPDATE trials SET status='running', started=? WHERE id=?",
                            (time.time(), trial_id))

    def finish_trial(self, trial_id: int, samples: list[Sample], environment: dict) -> None:
        """Samples and status in one transaction: the trial is kept whole or not at all."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.executemany("INSERT INTO samples (trial_id, idx, raw) VALUES (?, ?, ?)",
                                [(trial_id, i, s.model_dump_json()) for i, s in enumerate(samples)])
            self.db.execute("UPDATE trials SET status='done', ended=?, environment=? WHERE id=?",
                            (time.time(), json.dumps(environment), trial_id))

    def fail_trial(self, trial_id: int, error: str, environment: dict | None = None) -> None:
        with self.db:
            self.db.execute("UPDATE trials SET status='failed', ended=?, error=?, environment=? "
                            "WHERE id=?", (time.time(), error,
                                           json.dumps(environment) if environment else None,
                                           trial_id))

    def replan_trial(self, trial_id: int) -> None:
        """An interrupted trial goes back to the plan, to run again on resume."""
        with self.db:
            self.db.execute("UPDATE trials SET status='planned', started=NULL WHERE id=?",
                            (trial_id,))

    def replan_interrupted(self, exp_id: int) -> int:
        with self.db:
            return self.db.execute("UPDATE trials SET status='planned', started=NULL "
                                   "WHERE experiment_id=? AND status='running'",
                                   (exp_id,)).rowcount

    def save_attribution(self, exp_id: int, arm: str, kind: str, data: dict) -> None:
        with self.db:
            arm_id = self.db.execute("SELECT id FROM arms WHERE experiment_id=? AND name=?",
                                     (exp_id, arm)).fetchone()["id"]
            self.db.execute("INSERT OR REPLACE INTO attributions (experiment_id, arm_id, kind, "
                            "data, created) VALUES (?, ?, ?, ?, ?)",
                            (exp_id, arm_id, kind, json.dumps(data), time.time()))

    # ------------------------------------------------------------ reading

    def attributions(self, exp_id: int) -> dict[str, dict[str, dict]]:
        """{arm: {kind: data}} for every attribution stored."""
        out: dict[str, dict[str, dict]] = {}
        for r in self.db.execute("SELECT a.name, t.kind, t.data FROM attributions t JOIN arms a "
                                 "ON a.id=t.arm_id WHERE t.experiment_id=?", (exp_id,)):
            out.setdefault(r["name"], {})[r["kind"]] = json.loads(r["data"])
        return out

    def experiment(self, exp_id: int) -> sqlite3.Row:
        row = self.db.execute("SELECT * FROM experiments WHERE id=?", (exp_id,)).fetchone()
        if row is None:
            raise MmlabError(f"no experiment {exp_id} in {self.dir}")
        return row

    def experiments(self) -> list[sqlite3.Row]:
        return self.db.execute(
            "SELECT e.*, "
            "(SELECT COUNT(*) FROM trials t WHERE t.experiment_id=e.id) AS trials, "
            "(SELECT COUNT(*) FROM trials t WHERE t.experiment_id=e.id AND status='done') AS done, "
            "(SELECT COUNT(*) FROM trials t WHERE t.experiment_id=e.id AND status='failed') AS failed "
            "FROM experiments e ORDER BY e.id").fetchall()

    def trials(self, exp_id: int, status: str | None = None) -> list[Trial]:
        sql = ("SELECT t.*, a.name AS arm FROM trials t JOIN arms a ON a.id=t.arm_id "
               "WHERE t.experiment_id=?")
        args: list = [exp_id]
        if status:
            sql += " AND t.status=?"
            args.append(status)
        rows = self.db.execute(sql + " ORDER BY t.position", args).fetchall()
        return [Trial(r["id"], r["arm"], r["position"], r["round"], r["status"], r["started"],
                      r["ended"], r["error"]) for r in rows]

    def environments(self, exp_id: int) -> list[dict]:
        rows = self.db.execute("SELECT environment FROM trials WHERE experiment_id=? AND "
                               "environment IS NOT NULL ORDER BY position", (exp_id,)).fetchall()
        return [json.loads(r["environment"]) for r in rows]

    def samples_by_arm(self, exp_id: int) -> dict[str, list[Sample]]:
        """Every stored sample, grouped by arm, in arm order."""
        out: dict[str, list[Sample]] = {
            r["name"]: [] for r in self.db.execute(
                "SELECT name FROM arms WHERE experiment_id=? ORDER BY position", (exp_id,))}
        rows = self.db.execute(
            "SELECT a.name, s.raw FROM samples s JOIN trials t ON t.id=s.trial_id "
            "JOIN arms a ON a.id=t.arm_id WHERE t.experiment_id=? ORDER BY t.position, s.idx",
            (exp_id,))
        for r in rows:
            out[r["name"]].append(Sample.model_validate_json(r["raw"]))
        return out
