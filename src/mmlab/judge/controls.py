"""Matched-state controls: when the audit finds that a pair ran in different
page states, the same two arms once more with that state forced equal.

Seed 001's 6.19 backed a 16 MiB mapping with THPs where 6.12 did not; "is
6.19 slower at MADV_PAGEOUT" is only answered with both kernels in the same
state, which the report's reviewers did by hand (MADV_NOHUGEPAGE on both
sides).  mmlab derives those arms itself: for a THP difference both arms with
THP refused, and both with THP asked for (a kernel may still refuse it: the
control's own audit says so); for a swap difference both arms without swap;
for a DAMON difference (Debian's 6.19 starts damon_stat at boot, 6.12 does
not) both arms with every DAMON actor stopped.
KSM state has no such lever: merging is what ksm-rmap measures, and forcing
it off would remove the question, so no control is derived for it.

Controls are arms of the same experiment, marked by `control_of` and
`control`, interleaved among themselves like any arms; their pairs are
judged like any pair and reported beside the pair they control.
"""

from __future__ import annotations

import itertools

from mmlab.experiment.plan import Arm, Plan, baseline_for
from mmlab.judge.comparison import Comparison
from mmlab.judge.criteria import Verdict
from mmlab.workloads import Workload

# The audit checks a control can answer, by the state it forces.
STATES = {
    "thp": ("THP backing of the mapping", "THP faults, splits and swap-out fallbacks",
            "mTHP allocations, fallbacks, splits and swap-outs"),
    "swap": ("swap configured", "swap used", "pages swapped out"),
    "damon": ("DAMON running",),
}


def _forcings(wl: Workload, state: str) -> list[tuple[str, dict, dict]]:
    """(label, parameter update, settings update) for each control of `state`.
    THP is forced per mapping where the workload can (madvise), which needs
    no global change; otherwise system-wide."""
    if state == "swap":
        return [("swap=none", {}, {"swap": "none"})]
    if state == "damon":
        return [("damon=off", {}, {"damon": "off"})]
    if any(p.name == "thp" and "nohugepage" in p.choices for p in wl.params):
        return [(f"thp={mode}", {"thp": mode}, {}) for mode in ("nohugepage", "hugepage")]
    return [(f"thp_mode={mode}", {}, {"thp": mode}) for mode in ("never", "always")]


def control_arm(arm: Arm, label: str, params: dict, settings: dict) -> Arm:
    """`arm` with one state forced, named and marked as its control.  The
    settings are re-validated as the arm's own type, so the judge needs
    nothing of the machine's."""
    return arm.model_copy(update={
        "name": f"{arm.name} [control {label}]",
        "values": {**arm.values, "control": label},
        "params": {**arm.params, **params},
        "settings": type(arm.settings).model_validate({**arm.settings.model_dump(), **settings}),
        "control_of": arm.name, "control": label})


def derive(plan: Plan, findings: dict[tuple[str, str], list]) -> list[Arm]:
    """The control arms that the not-comparable pairs in `findings` (the
    audit's, per (arm, baseline)) call for and the plan does not have yet."""
    have = {a.name for a in plan.arms}
    out: dict[str, Arm] = {}
    for (arm_name, base_name), found in findings.items():
        arm = plan.arm(arm_name)
        if arm.control_of is not None:
            continue
        # A neighbour's difference, or one the metrics are divided by, makes
        # no metric incomparable: nothing to force.
        checks = {f.check for f in found
                  if any(f.matters_for(metric) for metric in plan.profile.metrics)}
        states = [state for state, names in STATES.items() if checks & set(names)]
        for label, params, settings in _combined(plan.workload, states):
            for side in (arm, plan.arm(base_name)):
                c = control_arm(side, label, params, settings)
                if c.name not in have:
                    out.setdefault(c.name, c)
    return list(out.values())


def _combined(wl: Workload, states: list[str]) -> list[tuple[str, dict, dict]]:
    """The controls of a pair that differs in several states: each forces all
    of them at once (a control equal in THP but not in DAMON answers
    nothing), one per combination of the ways to force each."""
    if not states:
        return []
    out = []
    for combo in itertools.product(*(_forcings(wl, st) for st in states)):
        label = ", ".join(lab for lab, _, _ in combo)
        params = {k: v for _, p, _ in combo for k, v in p.items()}
        settings = {k: v for _, _, st in combo for k, v in st.items()}
        out.append((label, params, settings))
    return out


def matched(plan: Plan, comparisons: list[Comparison]
            ) -> dict[tuple[str, str, str], list[tuple[str, Comparison]]]:
    """For each not-comparable (metric, arm, baseline): (forced state, the
    control pair's comparison) of every control of that pair."""
    by_key = {(c.metric, c.arm, c.baseline): c for c in comparisons}
    out: dict[tuple[str, str, str], list[tuple[str, Comparison]]] = {}
    for c in comparisons:
        if c.verdict != Verdict.NOT_COMPARABLE:
            continue
        for ctrl in plan.arms:
            if ctrl.control_of != c.arm or ctrl.control is None:
                continue
            base = baseline_for(plan, ctrl)
            found = by_key.get((c.metric, ctrl.name, base.name)) if base else None
            if found is not None:
                out.setdefault((c.metric, c.arm, c.baseline), []).append((ctrl.control, found))
    return out
