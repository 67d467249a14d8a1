"""`mmlab store copy SRC DST`: experiments moved between stores, a lab
directory's SQLite into a fleet's PostgreSQL and back.

Each experiment is copied whole in one transaction of the destination
(experiment, arms, trials with their status and environment, samples,
attributions), keeping its id when the destination has it free.  One that
is already there (same name, creation time and profile hash) is skipped, so
a copy can be repeated.  The fleet's machine registry is not copied: it is
the workers' current state, not results.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from mmlab.errors import MmlabError
from mmlab.store import Store

COLUMNS = {
    "experiments": ("name", "workload", "profile_path", "profile_text", "profile_hash", "seed",
                    "created", "plan"),
    "arms": ("name", "position", "spec"),
    "trials": ("position", "round", "slot", "order_seed", "status", "target", "started", "ended",
               "environment", "error"),
}


def copy(src: Store, dst: Store) -> Iterator[str]:
    """Copy every experiment of `src` missing from `dst`; yields one line each.
    A store copied onto itself is refused: it would only say "skipped"."""
    if src.where == dst.where or (src.dir and dst.dir and src.dir.resolve() == dst.dir.resolve()):
        raise MmlabError(f"store copy: {src.where} and {dst.where} are the same store")
    present = {_identity(r): r["id"] for r in dst.experiments()}
    for row in src.experiments():
        if _identity(row) in present:
            yield (f"experiment {row['id']}: already in {dst.where} as experiment "
                   f"{present[_identity(row)]}, skipped")
            continue
        new_id = _copy_experiment(src, dst, row)
        yield (f"experiment {row['id']} -> {dst.where} experiment {new_id}: {row['name']}, "
               f"{row['trials']} trials")


def _identity(row: Mapping[str, Any]) -> tuple:
    return row["name"], row["created"], row["profile_hash"]


def _insert(dst: Store, table: str, values: dict[str, Any]) -> int:
    names = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    return dst.db.execute(f"INSERT INTO {table} ({names}) VALUES ({marks}) RETURNING id",
                          tuple(values.values())).fetchone()["id"]


def _copy_experiment(src: Store, dst: Store, row: Mapping[str, Any]) -> int:
    exp_id = row["id"]
    with dst.db.transaction():
        values = {c: row[c] for c in COLUMNS["experiments"]}
        keep = dst.db.execute("SELECT id FROM experiments WHERE id=?", (exp_id,)).fetchone() is None
        new_id = _insert(dst, "experiments", {"id": exp_id, **values} if keep else values)
        if keep:
            dst.db.set_next_id("experiments")
        arms = {r["id"]: _insert(dst, "arms", {"experiment_id": new_id,
                                                **{c: r[c] for c in COLUMNS["arms"]}})
                for r in src.db.execute("SELECT * FROM arms WHERE experiment_id=? ORDER BY id",
                                        (exp_id,)).fetchall()}
        trials = {r["id"]: _insert(dst, "trials", {"experiment_id": new_id,
                                                    "arm_id": arms[r["arm_id"]],
                                                    **{c: r[c] for c in COLUMNS["trials"]}})
                  for r in src.db.execute("SELECT * FROM trials WHERE experiment_id=? "
                                          "ORDER BY position", (exp_id,)).fetchall()}
        dst.db.executemany("INSERT INTO samples (trial_id, idx, raw) VALUES (?, ?, ?)",
                           [(trials[r["trial_id"]], r["idx"], r["raw"]) for r in src.db.execute(
                               "SELECT s.trial_id, s.idx, s.raw FROM samples s JOIN trials t "
                               "ON t.id=s.trial_id WHERE t.experiment_id=? ORDER BY s.id",
                               (exp_id,)).fetchall()])
        dst.db.executemany("INSERT INTO attributions (experiment_id, arm_id, kind, data, created) "
                           "VALUES (?, ?, ?, ?, ?)",
                           [(new_id, arms[r["arm_id"]], r["kind"], r["data"], r["created"])
                            for r in src.db.execute("SELECT * FROM attributions WHERE "
                                                    "experiment_id=?", (exp_id,)).fetchall()])
    return new_id
