"""Folded stacks ("root;...;leaf weight") from `perf script`, their top
functions, and the difference between two arms in the metric's own unit.

The difference is made comparable by normalising each arm's sampled CPU time
by the work it did (pages or ops): a function's cost is its inclusive share
of the samples times the CPU time per unit of work.  Ranking functions by how
much that cost changed tells which paths carry a change: "the extra 1.1 us
per page is 70 % in shrink_folio_list".
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from pydantic import BaseModel

HEADER = re.compile(r"^\S.*?\s+(\d+)(?:/\d+)?\s+(\d+)\s*$")   # comm pid/tid period
FRAME = re.compile(r"^\s+[0-9a-f]+\s+(\S+)")


def fold(perf_script: str) -> Counter[str]:
    """`perf script -F comm,pid,tid,period,ip,sym` output -> folded stacks
    weighted by the sample period (ns for cpu-clock)."""
    folded: Counter[str] = Counter()
    weight = 0
    frames: list[str] = []

    def flush() -> None:
        if frames:
            folded[";".join(reversed(frames))] += weight

    for line in perf_script.splitlines():
        if not line.strip():
            flush()
            weight, frames = 0, []
            continue
        m = FRAME.match(line)
        if m and line[0].isspace():
            sym = m.group(1).split("+0x")[0]
            frames.append(sym if sym != "[unknown]" else "[unknown]")
            continue
        head = HEADER.match(line)
        if head:
            flush()
            weight, frames = int(head.group(2)), []
    flush()
    return folded


@dataclass(frozen=True)
class FunctionCost:
    function: str
    inclusive: float     # share of all samples with the function on the stack
    self_share: float    # share with the function as the leaf


def top_functions(folded: Counter[str], n: int = 15) -> list[FunctionCost]:
    total = sum(folded.values()) or 1
    incl: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    for stack, w in folded.items():
        frames = stack.split(";")
        for f in dict.fromkeys(frames):      # once per stack, in a stable order
            incl[f] += w
        leaf[frames[-1]] += w
    return [FunctionCost(f, incl[f] / total, leaf[f] / total)
            for f, _ in incl.most_common(n)]


@dataclass(frozen=True)
class Delta:
    function: str
    cost: float           # this arm, per unit of work
    cost_baseline: float
    change: float         # cost - cost_baseline
    share_of_change: float  # change / total change of CPU time per unit


def diff(folded: Counter[str], units: float, base: Counter[str], base_units: float,
         n: int = 15) -> list[Delta]:
    """Functions ranked by how much their CPU time per unit of work changed."""
    def per_unit(f: Counter[str], u: float) -> tuple[Counter[str], float]:
        incl: Counter[str] = Counter()
        for stack, w in f.items():
            for fn in dict.fromkeys(stack.split(";")):
                # typeshed types a Counter's counts as int; the docs allow floats
                incl[fn] += w / u  # type: ignore[assignment]
        return incl, sum(f.values()) / u
    a, total_a = per_unit(folded, units)
    b, total_b = per_unit(base, base_units)
    change = total_a - total_b
    rows = [Delta(fn, a[fn], b[fn], a[fn] - b[fn],
                  (a[fn] - b[fn]) / change if change else 0.0) for fn in a.keys() | b.keys()]
    rows.sort(key=lambda d: (-abs(d.change), d.function))   # ties by name: reproducible
    return rows[:n]


def focus(folded: Counter[str], function: str) -> Counter[str]:
    """Only the stacks that pass through `function`: one phase of a workload
    (e.g. do_madvise for pageout-refault's advise_ns_per_page)."""
    return Counter({s: w for s, w in folded.items() if function in s.split(";")})


def to_text(folded: Counter[str]) -> str:
    """The folded format flamegraph tools read."""
    return "".join(f"{stack} {w}\n" for stack, w in folded.most_common())


def from_text(text: str) -> Counter[str]:
    out: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, w = line.rpartition(" ")
        if stack:
            out[stack] += int(w)
    return out


class StackProfile(BaseModel):
    """What one perf run stores for an arm: its folded stacks, the work they
    did (to put CPU time per unit of work) and the metrics under collection."""
    folded: str                     # to_text() of the folded stacks
    units: float
    unit: str                       # pages, ops or sample
    event: str = "cpu-clock"
    metrics: dict[str, float | None] = {}

    def stacks(self, through: str | None = None) -> Counter[str]:
        """The folded stacks, only those through `through` if given."""
        folded = from_text(self.folded)
        return focus(folded, through) if through else folded
