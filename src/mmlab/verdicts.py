"""Stored samples -> one verdict per metric and pair of arms.

Pairs come from the profile's baseline, the figures from stats.compare, and
the same-state audit can overrule any verdict with `not comparable`.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import audit, stats, workloads
from .experiment import Arm, Plan, baseline_for
from .samples import Sample


@dataclass(frozen=True)
class Pair:
    arm: Arm
    baseline: Arm

    @property
    def differing_axes(self) -> set[str]:
        return {k for k in self.arm.values.keys() | self.baseline.values.keys()
                if str(self.arm.values.get(k)) != str(self.baseline.values.get(k))}


def pairs(plan: Plan) -> list[Pair]:
    out = []
    for arm in plan.arms:
        base = baseline_for(plan, arm)
        if base is not None:
            out.append(Pair(arm, base))
    return out


@dataclass(frozen=True)
class Judgement:
    comparisons: list[stats.Comparison]
    findings: dict[tuple[str, str], list[audit.Finding]]   # per (arm, baseline)
    arm_findings: dict[str, list[audit.Finding]]


def judge(plan: Plan, samples: dict[str, list[Sample]],
          metrics: list[str] | None = None) -> Judgement:
    profile = plan.profile
    wl = workloads.get(profile.workload)
    arm_findings = {name: audit.audit_arm(name, s) for name, s in samples.items()}
    comparisons, findings = [], {}
    for pair in pairs(plan):
        a, b = samples.get(pair.arm.name, []), samples.get(pair.baseline.name, [])
        found = (audit.audit_pair(pair.arm.name, pair.baseline.name, a, b, pair.differing_axes)
                 + arm_findings.get(pair.arm.name, []) + arm_findings.get(pair.baseline.name, []))
        findings[(pair.arm.name, pair.baseline.name)] = found
        for metric in metrics or profile.metrics:
            c = stats.compare(metric, pair.arm.name, pair.baseline.name,
                              [s.metrics.get(metric) for s in a],
                              [s.metrics.get(metric) for s in b],
                              wl.metric(metric).higher_is_better, profile.tolerance,
                              profile.max_cv, profile.alpha, profile.seed)
            relevant = [f for f in found if f.matters_for(metric)]
            if relevant:
                c = stats.not_comparable(c, "; ".join(map(str, relevant)))
            comparisons.append(c)
    return Judgement(comparisons, findings, arm_findings)
