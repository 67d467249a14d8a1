"""`mmlab selftest verdicts`'s report: the simulated operating
characteristics (judge/selftest.py) as a table, and whether the published
targets are met."""

from __future__ import annotations

from rich.table import Table

from mmlab.judge.criteria import Criteria
from mmlab.judge.selftest import ARMS, HEADER, METRICS, Cell, Targets, run, table_rows
from mmlab.report.terminal import console


def table(cells: list[Cell], criteria: Criteria, experiments: int, seed: int):
    """The operating characteristics as a rich table, one row per noise model."""
    out = Table(title=f"verdicts at the defaults, simulated: {experiments} profiles of {ARMS} arms "
                      f"x {METRICS} metrics per cell, seed {seed}; {criteria.describe()}")
    for col in HEADER:
        out.add_column(col, justify="left" if col in ("noise", "model") else "right")
    for row in table_rows(cells):
        out.add_row(*row)
    return out


def print_report(experiments: int = 2000, seed: int = 1) -> list[str]:
    """Simulate at the defaults, print the table and the targets; returns the
    targets missed (none when all are met)."""
    criteria = Criteria()
    cells = run(criteria, experiments, seed)
    out = console()
    out.print(table(cells, criteria, experiments, seed))
    t = Targets()
    missed = t.missed(cells, criteria)
    verdict = "met" if not missed else "MISSED: " + "; ".join(missed)
    out.print(f"targets: family false alarms <= {t.family_alarms:.0%}, A/A no change >= "
              f"{t.aa_no_change:.0%}, +10% detected >= {t.detect_10:.0%}, at most "
              f"{t.max_rounds} rounds: {verdict}")
    return missed
