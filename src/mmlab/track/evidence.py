"""What a change shows, read from its confirmation experiment: the table a
maintainer knows from 0-day reports (each tracked metric on both releases
with its spread, the change and its interval), the side metrics (vmstat
counters per unit of work that moved, the page state of both sides, the
same-state audit's findings), the kernel functions whose instructions per
unit moved most (where the profile counts them), and the commands that
reproduce it, narrow it further and bundle its evidence.

Records only: report/ renders them (report/dashboard.py writes the dashboard).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from mmlab.attribution import explain
from mmlab.attribution.explain import CountChange, WindowFunctions
from mmlab.judge import audit
from mmlab.judge.comparison import Comparison
from mmlab.store import Store
from mmlab.track import cells, changepoints
from mmlab.track.changepoints import Change
from mmlab.track.judged import Judged, Judgements
from mmlab.track.suite import Suite
from mmlab.workloads.samples import Sample

FUNCTIONS = 8      # functions shown per window


@dataclass(frozen=True)
class MetricRow:
    """One tracked metric on both releases of a change."""
    metric: str
    unit: str
    before: float                  # medians
    after: float
    spread_before: float           # robust CVs
    spread_after: float
    ratio: float
    ci: tuple[float, float]
    verdict: str                   # mmlab's verdict on the pair
    outcome: str                   # what the tracker makes of it (changepoints.outcome_of,
    #                                emulated_outcome where the figures are emulated time)
    emulated: bool = False         # its figures are emulated time (a TCG guest's clock)
    why: str = ""                  # why the outcome is not the verdict (changepoints.why)


@dataclass(frozen=True)
class StateRow:
    """A page-state key the audit reads, on both releases (median or most
    common value of the samples)."""
    key: str
    before: float | str
    after: float | str


@dataclass(frozen=True)
class Evidence:
    change: Change
    before: str                    # exact kernels and package versions
    after: str
    confirmed_at: str              # when the confirmation was made (ISO 8601, UTC)
    rounds: int
    measured: str = ""             # the class of metric the confirmation measured: counts or
    #                                times (an emulated time step its counts decided: counts)
    metrics: list[MetricRow] = field(default_factory=list)
    vmstat: list[CountChange] = field(default_factory=list)
    state: list[StateRow] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    functions: list[WindowFunctions] = field(default_factory=list)
    commands: dict[str, str] = field(default_factory=dict)


def gather(store: Store, suite: Suite, change: Change, results: str,
           judged: Judgements) -> Evidence:
    """A change's evidence; a candidate never measured has its commands
    only.  `judged` holds the run's judgements (session.TrackResult.judged)."""
    tracked = next(t for t in suite.profiles if t.name == change.profile)
    commands = _commands(tracked.plan.path, change, results)
    if change.evidence is None or change.releases is None:
        return Evidence(change, change.before, change.after, "", 0, commands=commands)
    exp_id = change.evidence
    j = judged[exp_id]
    mine = cells.kernel_comparison(j.plan, j.judgement.comparisons, change.metric)
    arm, base = (mine.arm, mine.baseline) if mine else ("", "")
    samples = j.measured.by_arm
    b, a = change.releases
    created = datetime.fromtimestamp(store.experiment(exp_id)["created"], UTC)
    return Evidence(
        change, f"{b.name} ({b.version})", f"{a.name} ({a.version})",
        created.strftime("%Y-%m-%dT%H:%M:%SZ"), j.measured.rounds,
        "counts" if all(changepoints.is_count(m) for m in j.plan.profile.metrics) else "times",
        metrics=_rows(tracked.metrics, change.metric, judged, exp_id, change.also),
        vmstat=explain.vmstat_changes(samples.get(arm, []), samples.get(base, [])),
        state=_state(samples.get(base, []), samples.get(arm, [])),
        findings=[str(f) for f in j.judgement.findings.get((arm, base), [])],
        functions=_functions(store, exp_id, arm, base, change.metric), commands=commands)


def _rows(tracked: list[str], metric: str, judged: Judgements, exp_id: int,
          also: int | None) -> list[MetricRow]:
    """Every tracked metric the pair's confirmations measured, in the
    suite's order, the change's own `metric` where the tracker followed it
    (a syscall's count), and any other they measured after them (the counts
    that decided a profile of times): the change's own class of metric,
    and the other class where the pair has that confirmation too (they are
    confirmed apart).  An emulated time row's outcome is what the pair's
    counts make of it."""
    found = [(judged[e], c) for e in (exp_id, also) if e is not None
             for m in dict.fromkeys([*judged[e].plan.profile.metrics, metric])
             if (c := cells.kernel_comparison(judged[e].plan, judged[e].judgement.comparisons,
                                              m))]
    said = changepoints.counted([changepoints.outcome_of(c.metric, c) for _, c in found
                                 if changepoints.is_count(c.metric)])
    rows = [_row(j, c, said) for j, c in found]
    return sorted(rows, key=lambda r: tracked.index(r.metric) if r.metric in tracked
                  else len(tracked))


def _row(j: Judged, c: Comparison, said: str | None) -> MetricRow:
    """`said`: what the pair's counts say (changepoints.counted)."""
    emulated = j.emulated(c)
    outcome = changepoints.outcome_of(c.metric, c)
    if emulated:
        outcome = changepoints.emulated_outcome(outcome, said)
    return MetricRow(c.metric, j.plan.workload.metric(c.metric).unit, c.median_baseline,
                     c.median, c.rcv_baseline, c.rcv, changepoints.stated_ratio(c),
                     (c.ci_low, c.ci_high),
                     str(c.verdict), outcome, emulated, changepoints.why(c.metric, c, outcome))


def _state(before: list[Sample], after: list[Sample]) -> list[StateRow]:
    """The page-state keys of the audit's checks that either side has."""
    keys = [k for check in audit.CHECKS if check.page_state and check.section == "state"
            for k in check.keys if "*" not in k]
    return [StateRow(k, _typical(before, k), _typical(after, k)) for k in dict.fromkeys(keys)
            if any(k in s.state for s in before + after)]


def _typical(samples: list[Sample], key: str) -> float | str:
    """The median of numbers (a report formats it), else the most common value."""
    values = [s.state[key] for s in samples if key in s.state]
    if not values:
        return "-"
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(numbers) == len(values):
        return float(statistics.median(numbers))
    return str(Counter(map(str, values)).most_common(1)[0][0])


def _functions(store: Store, exp_id: int, arm: str, base: str,
               metric: str) -> list[WindowFunctions]:
    """Instructions per unit by function, the releases' attribution runs
    against each other where both counted them: the window the change's
    metric times first (advise_ns_per_page: advise), windows where no
    instruction moved left out."""
    counted = explain.load(store.attributions(exp_id))
    fa = counted.get(arm) and counted[arm].functions
    fb = counted.get(base) and counted[base].functions
    if not (fa and fb):
        return []
    windows = [w for w in explain.explain_functions(arm, fa, base, fb, FUNCTIONS) if w.change]
    return sorted(windows, key=lambda w: not metric.startswith(f"{w.window}_"))


def _commands(profile: str, change: Change, results: str) -> dict[str, str]:
    """Reproduce the pair; narrow it to a commit where both sides are
    upstream releases (Debian's, from a linux-stable tree); show and bundle
    the evidence."""
    at = f" --results {results}"
    if change.releases is None:
        return {}
    b, a = (r.name for r in change.releases)
    out = {"reproduce": f"mmlab narrow {profile} --kernels {b},{a} --metric {change.metric}{at}"}
    if b.startswith("debian:") and a.startswith("debian:"):
        tags = "..".join("v" + r.split(":", 1)[1].split("-", 1)[0] for r in (b, a))
        out["narrow"] = (f"mmlab narrow {profile} --source LINUX_STABLE_TREE --commits {tags} "
                         f"--metric {change.metric}{at}")
    if change.evidence is not None:
        out["report"] = f"mmlab report {change.evidence}{at} --format html -o {change.id}.html"
        out["bundle"] = f"mmlab bundle {change.evidence} {change.id}-evidence --tar{at}"
    return out
