"""CSV, as `compare --csv` prints it and the evidence bundle writes it: one
row per dict, its keys the header (a bundle file's: every row's keys)."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path

from mmlab.experiment.plan import Plan
from mmlab.judge.verdicts import Judgement
from mmlab.report import auditnotes
from mmlab.workloads.samples import Sample


def comparisons(plan: Plan, judged: Judgement, samples: Mapping[str, Sequence[Sample]]) -> str:
    """One comparison per row, the columns of Comparison.as_row, what a
    counted figure counts and the audit's findings on its pair
    (auditnotes.columns), and whether its figures are emulated time."""
    rows = [{**c.as_row(), **auditnotes.columns(plan, judged, samples, c),
             "emulated": judged.emulated_time(plan, c)} for c in judged.comparisons]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["metric"])
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def write(path: Path, rows: list[dict]) -> None:
    """The rows as a file; no rows: an empty file.  The header is every key
    of any row, in order of first appearance (a syscall one sample made and
    another did not is a column of the one, empty in the other)."""
    with open(path, "w", newline="") as f:
        if rows:
            w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
            w.writeheader()
            w.writerows(rows)
