"""Guest states: do the saved boots a counted arm's trials start from agree?

A restored guest starts from one of its kernel's saved boots (`guest_state`,
targets/snapshot.py), taken in turn, so an arm's trials cover every boot and
the count rule's noise holds their spread.  Where a path's cost depends on
the state a boot leaves (free lists, per-CPU page lists, what ran at boot),
the boots' counts differ beyond their own trials' spread; this module finds
such counts from the samples alone, and the audit (audit.py) turns what it
finds into findings.

A count says that the boots disagree, not where: the trials count a window
or a syscall as one figure.  Where the arm's attribution also counted the
kernel's instructions by function from each saved boot (`functions`: state
index -> window -> function -> instructions per unit), the boots furthest
apart are set function by function, so the finding names the functions
whose counts differ most between them.  Attribution counts each boot so
only for an arm whose boots disagree, unless the profile asks for it
(`attribution_plan`, which the runner asks with the arm's stored samples).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import get_args

import numpy as np

from mmlab.experiment.plan import Plan
from mmlab.experiment.profile import Profile
from mmlab.judge import criteria
from mmlab.workloads import clock_paced, is_count
from mmlab.workloads.samples import Sample

STATE_KEY = "guest_state"      # the saved boot a restored guest started from: "INDEX:ID"
STATES_MARGIN = 3.0   # boots differ beyond this many times their widest own range
# and beyond the count rule's floor of the metric (criteria.COUNT_FLOORS: a
# whole window's 1%, a path's 0.25%), as a step between kernels must.
NAMED_COUNTS = 3      # counts a finding names (the rest are counted)
NAMED_FUNCTIONS = 3   # functions a finding names
# Where a finding judged with no counts by function from each boot (a run's
# own summary, made before its attribution) says they will be named.
FUNCTIONS_LATER = ("the functions that differ between the boots: named by `mmlab compare` "
                   "and `mmlab report` once attribution has counted each boot (--attribute)")

# One state's counts by function: window -> function -> instructions per unit.
ByFunction = Mapping[str, Mapping[str, float]]
# The attribution kind that holds an arm's ByFunction per saved boot (state
# index); the store gives it to the judge with the arm's samples.
STATE_FUNCTIONS = "state_functions"
# Every attribution kind a profile may name (its `attribution`; none: all).
KINDS: tuple[str, ...] = get_args(get_args(Profile.model_fields["attribution"].annotation)[0])


def state_medians(samples: list[Sample], metric: str) -> dict[str, tuple[float, float]]:
    """Each saved boot's (median, own range) of `metric` over its samples,
    the range NaN where the boot has one value; booted guests (each its
    own state) and samples without it are left out."""
    groups: dict[str, list[float]] = {}
    for s in samples:
        v, state = s.metrics.get(metric), s.state.get(STATE_KEY)
        if state and v is not None and np.isfinite(v):
            groups.setdefault(str(state), []).append(float(v))
    return {k: (float(np.median(v)), max(v) - min(v) if len(v) > 1 else np.nan)
            for k, v in groups.items()}


def apart(medians: dict[str, tuple[float, float]], metric: str) -> tuple[str, str] | None:
    """The lowest and highest boots when their medians differ beyond their
    own spread (STATES_MARGIN) and `metric`'s floor (floor_of); None if not,
    or if no boot has two values: one trial per boot cannot tell the
    boots' difference from the trials' own (8 saved boots of debian:6.12,
    one trial each, spread 1.4% where trials of one boot spread up to 0.9%)."""
    own_ranges = [r for _, r in medians.values() if np.isfinite(r)]
    if len(medians) < 2 or not own_ranges:
        return None
    lo = min(medians, key=lambda k: medians[k][0])
    hi = max(medians, key=lambda k: medians[k][0])
    gap, own = medians[hi][0] - medians[lo][0], max(own_ranges)
    floor = floor_of(metric) * abs(float(np.median([m for m, _ in medians.values()])))
    return (lo, hi) if gap > max(STATES_MARGIN * own, floor) else None


def floor_of(metric: str) -> float:
    """The share below which two figures of the counted `metric` are one:
    the count rule's floor, so the boots disagree where a step between two
    kernels would be a change."""
    return criteria.COUNT_FLOORS[criteria.count_family(metric)]


def counted(*arms: list[Sample]) -> list[str]:
    """The counts the arms' samples hold, but those the host's clock paces
    (workloads.clock_paced: no series of the tracker's either)."""
    return sorted({m for ss in arms for s in ss for m in s.metrics
                   if is_count(m) and not clock_paced(m)})


def disagree(samples: list[Sample],
             functions: Mapping[str, ByFunction] | None = None) -> str:
    """The arm's counts on which its saved boots disagree, headed by the
    kernel, largest share first, each with its two furthest boots, and the
    functions that differ most between the first one's boots where
    `functions` holds both, or without `functions` where they will be
    named ("" if the boots agree)."""
    seen = []
    for metric in counted(samples):
        med = state_medians(samples, metric)
        if (pair := apart(med, metric)) is not None:
            lo, hi = med[pair[0]][0], med[pair[1]][0]
            seen.append(((hi - lo) / abs(lo) if lo else np.inf, metric, pair,
                         f"{metric} {lo:,.6g} from boot {pair[0]} vs {hi:,.6g} from {pair[1]}"))
    if not seen:
        return ""
    seen.sort(key=lambda x: x[0], reverse=True)
    rest = len(seen) - NAMED_COUNTS
    more = f" and {rest} more counts" if rest > 0 else ""
    text = kernel_of(samples) + "; ".join(f"{what} ({share:+.1%})"
                                          for share, _, _, what in seen[:NAMED_COUNTS]) + more
    if not functions:
        return f"{text}; {FUNCTIONS_LATER}"
    _, metric, (lo_state, hi_state), _ = seen[0]
    named = functions_apart(functions, lo_state, hi_state, metric)
    return text + (f"; {named}" if named else "")


def attribution_plan(plan: Plan, samples: list[Sample]) -> Plan:
    """The plan an arm's attribution runs: the profile's, but where it names
    no kind (every kind), without STATE_FUNCTIONS unless the arm's stored
    samples show its saved boots disagreeing on a count (`disagree`, the
    audit's `guest states differ`).  Each boot counted by function costs
    an attribution boot (one took about 3.5 counting trials' time here),
    and where the boots agree the first boot's counts say what the others
    would; a profile that names state_functions gets them always."""
    if plan.profile.attribution or disagree(samples):
        return plan
    kinds = [k for k in KINDS if k != STATE_FUNCTIONS]
    return plan.model_copy(update={"profile": plan.profile.model_copy(
        update={"attribution": kinds})})


def kernel_of(samples: list[Sample]) -> str:
    """Whose saved boots these are, as a finding's head: the kernel as the
    profile names it and as the guest's uname gives it ("saved boots of
    debian:6.1 (RELEASE): "), since an arm's name need not say it (a
    one-arm experiment's does not), and its samples do."""
    names = sorted({str(v) for s in samples if (v := s.state.get("guest_kernel"))})
    releases = sorted({str(v) for s in samples if (v := s.state.get("kernel"))})
    if not names and not releases:
        return ""
    release = f" ({'/'.join(releases)})" if names and releases else ""
    return f"saved boots of {'/'.join(names or releases)}{release}: "


def functions_apart(functions: Mapping[str, ByFunction], lo: str, hi: str, metric: str,
                    n: int = NAMED_FUNCTIONS) -> str:
    """The functions whose counts differ most from boot `lo` to boot `hi`,
    in words ("" without both boots' counts): in the window `metric` counts
    if it names one (the longest name it starts with: map_fault_... is
    map_fault's, not map's), else in every window.  Boots are matched by index (the
    label's "INDEX:" part), which is how attribution restores them."""
    a, b = (functions.get(label.split(":")[0]) for label in (lo, hi))
    if a is None or b is None:
        return ""
    named = [w for w in set(a) | set(b) if metric.startswith(f"{w}_")]
    windows = [max(named, key=len)] if named else sorted(set(a) | set(b))
    moved: dict[str, float] = {}
    for w in windows:
        fa, fb = a.get(w, {}), b.get(w, {})
        for fn in set(fa) | set(fb):
            label = fn if len(windows) == 1 else f"{w}: {fn}"
            moved[label] = fb.get(fn, 0.0) - fa.get(fn, 0.0)
    top = sorted((kv for kv in moved.items() if kv[1]), key=lambda kv: -abs(kv[1]))[:n]
    if not top:
        return ""
    where = f" ({windows[0]}, per unit)" if len(windows) == 1 else " (per unit)"
    return (f"functions that differ most from boot {lo.split(':')[0]} to "
            f"{hi.split(':')[0]}{where}: " + ", ".join(f"{fn} {d:+,.4g}" for fn, d in top))


def explained(arm: str, baseline: str, samples: list[Sample],
              base_samples: list[Sample]) -> list[tuple[str, str]]:
    """(count, in words) for each count whose difference between the arms
    the choice of a saved boot explains: one arm's boots disagree, and the
    ranges of the two arms' boot medians overlap while their medians differ
    by more than the floor."""
    found = []
    for metric in counted(samples, base_samples):
        a, b = state_medians(samples, metric), state_medians(base_samples, metric)
        if not a or not b or (apart(a, metric) is None and apart(b, metric) is None):
            continue
        ma, mb = (float(np.median([m for m, _ in x.values()])) for x in (a, b))
        ra, rb = ([min(m for m, _ in x.values()), max(m for m, _ in x.values())] for x in (a, b))
        if ra[0] <= rb[1] and rb[0] <= ra[1] and abs(ma - mb) > floor_of(metric) * abs(mb):
            found.append((metric, f"{metric}: {arm}'s boots give {ra[0]:,.6g}..{ra[1]:,.6g}, "
                                  f"{baseline}'s {rb[0]:,.6g}..{rb[1]:,.6g}"))
    return found
