"""What the tracker reads of a stored experiment: each judged once for a
whole run (`Judgements`), with the counts it holds beyond its profile's
metrics, which the tracker follows as series of their own (`followed`): a
syscall's, fault's or exception's path, and the inclusive count of a
function on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from mmlab.attribution.functions import INCLUSIVE
from mmlab.experiment.plan import Plan
from mmlab.judge import verdicts
from mmlab.judge.comparison import Comparison
from mmlab.judge.measurements import Measurements
from mmlab.store import Store
from mmlab.track.changepoints import by_one_build
from mmlab.workloads import CALLS, INSNS, PATH_STAY, Window
from mmlab.workloads.samples import Sample

# A followed path's figures: its calls, and its instructions per call (or a
# function's on it, inclusively); per unit is per call times calls, the
# same step again, and its events are the profile's to choose.
FOLLOWED = (CALLS, f"kernel_{INSNS}_per_call")
PATH_SHARE = 0.001   # of its window's kernel instructions: a stay's series worth following


@dataclass(frozen=True)
class Judged:
    """One stored experiment as `compare` judges it."""
    plan: Plan
    measured: Measurements
    judgement: verdicts.Judgement
    followed: list[str]    # the counts it holds beyond its profile's metrics (`followed`)

    def emulated(self, c: Comparison) -> bool:
        """The comparison's figures are emulated time."""
        return self.judgement.emulated_time(self.plan, c)


class Judgements:
    """Each stored experiment read and judged once for a whole run and its
    report: the series judge the cells, the confirmations and the changes'
    evidence judge the confirmations, and a pair's two confirmations show
    each other's rows."""

    def __init__(self, store: Store):
        self.store = store
        self.memo: dict[int, Judged] = {}

    def __getitem__(self, exp_id: int) -> Judged:
        if exp_id not in self.memo:
            plan = self.store.plan(exp_id)
            measured = self.store.measurements(exp_id)
            extra = followed(plan, measured)
            judged = verdicts.judge(plan, measured, [*plan.profile.metrics, *extra])
            self.memo[exp_id] = Judged(plan, measured, replace(judged, comparisons=by_one_build(
                judged.comparisons, measured.by_arm)), extra)
        return self.memo[exp_id]

    def comparisons(self, exp_id: int) -> tuple[Plan, list[Comparison]]:
        j = self[exp_id]
        return j.plan, j.judgement.comparisons

    def forget(self, exp_id: int) -> None:
        """Judge `exp_id` again when next asked: it has measured more."""
        self.memo.pop(exp_id, None)


def followed(plan: Plan, measured: Measurements) -> list[str]:
    """The counts a counting pass stored beyond the profile's metrics,
    which the tracker follows too, in name order: every syscall's, fault's
    and exception's calls and instructions per call (a profile naming one
    of them has them all counted), and the inclusive count per call of
    each function on their paths that the counting pass kept
    (functions.inclusive_metrics: those holding 10% of the path).  Not the
    windows' own instructions and events, nor the paths' events, which the
    profile chose among (naming one event has every window count them
    all); nor the interrupts and unnamed entries, whose counts follow the
    host's clock under TCG, not the kernel's path; nor a stay below
    PATH_SHARE of its window, or a function on its path (a C library's
    start-up calls: a step there, however sure, is nothing at the
    window's scale)."""
    wl = plan.workload
    samples = [s for t in measured.trials for s in t.samples]
    held = {k for s in samples for k in s.metrics}

    def wanted(m: str) -> bool:
        if (parts := wl.stay_parts(m)) is None:
            return False
        w, stay, figure = parts
        return (figure in FOLLOWED and bool(PATH_STAY.fullmatch(_path(stay)))
                and _share(samples, w, stay) >= PATH_SHARE)
    return sorted(filter(wanted, held - set(plan.profile.metrics)))


def _share(samples: list[Sample], w: Window, stay: str) -> float:
    """The largest share of its window's kernel instructions the stay (a
    function's on its path: the path's) held in a sample (1 where no
    sample says: followed, as before)."""
    stay = _path(stay)
    part, whole = (f"{w.name}_{p}kernel_insns_per_{w.unit}" for p in (f"{stay}_", ""))
    shares = [(s.metrics.get(part) or 0) / (s.metrics.get(whole) or math.inf) for s in samples]
    return max(shares) if any(shares) else 1.0


def _path(stay: str) -> str:
    """The path a stay's name is on (a function's inclusive count names it)."""
    return stay.partition(f"_{INCLUSIVE}_")[0]
