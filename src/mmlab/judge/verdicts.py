"""Stored trials -> one verdict per metric and pair of arms, look by look.

Pairs come from the profile's baseline (plan.pairs) and the figures from stats.  The
profile's rounds are judged at the planned looks (criteria.Criteria.looks): at
each look every (metric, pair) is estimated on the rounds so far, the family's
p-values are corrected together (Holm), and a comparison's verdict is the
first decisive one (no change, regression, improvement); one that is never
decisive is unreliable, with the reason the rounds stopped.  The same-state
audit can overrule any verdict with `not comparable`; order effects found in
the run (order.py) are named on the comparisons they touch.  The judgement also
says whether more rounds should be run, and how many: the adaptive runner
asks it after every look, so a run and a later report agree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from mmlab.experiment.plan import Plan, pairs
from mmlab.judge import audit, comparison, controls, criteria, measurements, order, stats
from mmlab.judge.criteria import Verdict
from mmlab.judge.measurements import Measurements
from mmlab.workloads import insns
from mmlab.workloads.samples import Sample


@dataclass(frozen=True)
class Judgement:
    comparisons: list[comparison.Comparison]
    findings: dict[tuple[str, str], list[audit.Finding]]   # per (arm, baseline)
    arm_findings: dict[str, list[audit.Finding]]
    criteria: criteria.Criteria = criteria.Criteria()
    rounds: int = 0                  # rounds in the stored plan
    next_rounds: int | None = None   # extend the plan to this many rounds; None: stop
    stopped: str = ""                # why no (more) rounds are added
    # per not-comparable (metric, arm, baseline): (forced state, the control pair's comparison)
    matched: dict[tuple[str, str, str], list[tuple[str, comparison.Comparison]]] = field(
        default_factory=dict)
    tcg: frozenset[str] = frozenset()   # the arms that ran in a TCG guest

    def emulated_time(self, plan: Plan, c: comparison.Comparison) -> bool:
        """The comparison's figures are emulated time (measurements.emulated),
        which every rendering of them says."""
        unit = plan.workload.metric(c.metric).unit
        return measurements.emulated(unit, (c.arm, c.baseline), self.tcg)

    @property
    def undecided(self) -> list[comparison.Comparison]:
        """Comparisons that more rounds could still decide."""
        return [c for c in self.comparisons if c.verdict == Verdict.UNRELIABLE and _fixable(c)]


def _fixable(c: comparison.Comparison) -> bool:
    return c.n > 0 and c.n_baseline > 0 and "median is 0" not in c.reason


def judge(plan: Plan, measured: Measurements | Mapping[str, list[Sample]],
          metrics: list[str] | None = None) -> Judgement:
    """Every (metric, pair) of `plan` judged from `measured` (the store's
    Measurements; plain samples per arm, without rounds, are judged unpaired)."""
    if not isinstance(measured, Measurements):
        measured = Measurements.of(measured)
    profile, wl = plan.profile, plan.workload
    crit = criteria.Criteria.of(profile)
    samples = measured.by_arm
    arm_findings = {name: audit.audit_arm(name, s, measured.functions.get(name))
                    for name, s in samples.items()}
    findings: dict[tuple[str, str], list[audit.Finding]] = {}
    keys: list[tuple[str, str, str]] = []          # (metric, arm, baseline)
    overrule: dict[tuple[str, str, str], str] = {}
    for pair in pairs(plan):
        a, b = samples.get(pair.arm.name, []), samples.get(pair.baseline.name, [])
        found = (audit.audit_pair(pair.arm.name, pair.baseline.name, a, b, pair.differing_axes)
                 + arm_findings.get(pair.arm.name, []) + arm_findings.get(pair.baseline.name, []))
        findings[(pair.arm.name, pair.baseline.name)] = found
        for metric in metrics or profile.metrics:
            key = (metric, pair.arm.name, pair.baseline.name)
            keys.append(key)
            relevant = [f for f in found if f.matters_for(metric)]
            if relevant:
                overrule[key] = "; ".join(map(str, relevant))

    observed = {(m, arm): measured.observations(arm, m) for m, a, b in keys for arm in (a, b)}
    counted = {m for m, _, _ in keys if insns.counted(wl, m)}
    final: dict[tuple[str, str, str], comparison.Comparison] = {}
    decided: set[tuple[str, str, str]] = set()
    for look, rounds in _looks_reached(crit, measured):
        ests = {key: stats.estimate(key[1], key[2], observed[(key[0], key[1])].upto(rounds),
                                    observed[(key[0], key[2])].upto(rounds), crit, look)
                for key in keys if key not in decided}
        # The family of this look: the tests still open (a decided comparison
        # claims nothing new), not overruled by the audit; a count is judged
        # by the count rule, not by its p.
        family = [k for k, e in ests.items() if k not in overrule and np.isfinite(e.p_value)
                  and k[0] not in counted]
        adjusted = dict(zip(family, stats.adjust(np.array([ests[k].p_value for k in family]),
                                                 crit.correction))) if family else {}
        correction = (f"Holm over {len(family)} tests" if crit.correction == "holm"
                      and len(family) > 1 else "")
        for key, e in ests.items():
            c = comparison.of_estimate(*key, e, adjusted.get(key, e.p_value),
                             wl.metric(key[0]).higher_is_better, crit, look, rounds, correction)
            if key[0] in counted and not e.problem:
                c = by_count(c, observed[(key[0], key[1])].upto(rounds).values,
                             observed[(key[0], key[2])].upto(rounds).values,
                             wl.metric(key[0]).higher_is_better)
            final[key] = c
            if c.verdict.decisive and key not in overrule:
                decided.add(key)

    out = []
    for key in keys:                 # every key was judged at the first look at least
        c = final[key]
        if key in decided:
            c = replace(c, stopped=f"decided at look {c.look} of {c.looks} ({c.rounds} rounds)")
        if key in overrule:
            c = comparison.not_comparable(c, overrule[key])
        near = [f for f in findings[key[1], key[2]] if f.beside]
        if near:
            c = replace(c, beside="; ".join(map(str, near)))
        out.append(c)
    next_rounds, stopped = _next_step(plan, crit, measured, out)
    out = [c if c.stopped else replace(c, stopped=stopped) for c in out]
    effects = order.effects(measured.trials, [a.name for a in plan.arms if a.control_of is None],
                            metrics or profile.metrics)
    out = [replace(c, order_effects=tuple(e for e in effects if e.metric == c.metric
                                          and e.arm in (None, c.arm, c.baseline)))
           for c in out]
    return Judgement(out, findings, arm_findings, crit, measured.rounds, next_rounds, stopped,
                     controls.matched(plan, out), frozenset(measurements.tcg_arms(samples)))


def by_count(c: comparison.Comparison, a, b, higher_is_better: bool) -> comparison.Comparison:
    """A counted metric's comparison judged by the count rule
    (criteria.count_outcomes on stats.separation), its reason giving the
    medians' step the rule reads (its ratio and interval stay the
    estimator's, as every metric's): counts are deterministic up to a noise
    they measure themselves, so the rounds needed are those that measure
    it, not those a rank test needs."""
    sep = stats.separation(a, b)
    step, noise, low, high = (float(x[0]) for x in (sep.step, sep.noise, sep.low, sep.high))
    family = criteria.count_family(c.metric)
    floor = criteria.COUNT_FLOORS[family]
    outcome = int(criteria.count_outcomes(step, noise, low, high, floor))
    margin = max(math.log1p(floor), criteria.COUNT_NOISES * noise)
    rule = (f"{criteria.COUNT_NOISES:g} robust CVs ({noise:.3%}) and the {family} floor "
            f"{floor:.2%}")
    if outcome == criteria.NO_CHANGE:
        why = f"counted: every trial within ±{floor:.2%} of every other (the {family} floor)"
    elif outcome != criteria.UNDECIDED:
        why = f"counted: medians {math.expm1(step):+.3%}, the sets apart and beyond {rule}"
    elif abs(step) > margin:
        why = f"counted: medians {math.expm1(step):+.3%}, but the sets overlap"
    else:
        why = f"counted: medians {math.expm1(step):+.3%}, not beyond {rule}"
    return replace(c, verdict=criteria.verdict_of(outcome, higher_is_better), reason=why,
                   p_adjusted=float("nan"), correction="",
                   method="count rule (range separation)")


def _looks_reached(crit: criteria.Criteria, measured: Measurements) -> list[tuple[int, int]]:
    """(look index, rounds) of each planned look the stored plan reaches.
    Samples without rounds are one look over everything."""
    looks = crit.looks()
    if not measured.rounds:
        n = max([sum(t.arm == a for t in measured.trials) for a in measured.arms] + [0])
        return [(max([k for k, r in enumerate(looks) if r <= n] + [0]), n)]
    reached = [(k, r) for k, r in enumerate(looks) if r <= measured.rounds]
    return reached or [(0, measured.rounds)]


def _next_step(plan: Plan, crit: criteria.Criteria, measured: Measurements,
               comparisons: list[comparison.Comparison]) -> tuple[int | None, str]:
    """(rounds to extend the plan to, or None; why)."""
    if measured.pending:
        return None, (f"{measured.pending} planned trials not run yet "
                      "(`mmlab experiment resume` runs them)")
    if not measured.rounds:
        return None, "rounds unknown"
    open_ = [c for c in comparisons if c.verdict == Verdict.UNRELIABLE and _fixable(c)]
    if not open_:
        return None, "every judged pair is decided"
    nxt = crit.next_look(measured.rounds)
    if nxt is None:
        return None, f"the maximum of {crit.max_rounds} rounds was reached"
    budget = plan.profile.budget_s
    if budget is not None and measured.finished:
        per_trial = measured.seconds / measured.finished
        need = per_trial * len(plan.arms) * (nxt - measured.rounds)
        if measured.seconds + need > budget:
            return None, (f"the time budget of {budget:.0f} s ran out: {measured.seconds:.0f} s "
                          f"spent, {nxt} rounds would need about {need:.0f} s more")
    return nxt, (f"not finished: {len(open_)} undecided, next look at {nxt} rounds "
                 "(`mmlab experiment resume` runs it)")
