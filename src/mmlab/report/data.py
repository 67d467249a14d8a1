"""Everything a report says, gathered once from the store.

Text, HTML and bundles render the same ReportData, so they cannot disagree.
It works on interrupted or partly failed experiments: what is missing is
listed in words instead of failing.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field

from .. import verdicts, workloads
from ..experiment import Plan, parse
from ..samples import Sample
from ..store import Store, Trial, status_counts


@dataclass
class ReportData:
    exp_id: int
    row: dict
    plan: Plan
    workload: workloads.Workload
    trials: list[Trial]
    environments: list[dict]
    samples: dict[str, list[Sample]]
    judgement: verdicts.Judgement
    attributions: dict[str, dict]
    missing: list[str] = field(default_factory=list)

    @property
    def accelerators(self) -> set[str]:
        return {str(s.state.get("accelerator")) for ss in self.samples.values() for s in ss
                if "accelerator" in s.state}

    def counts(self) -> dict[str, int]:
        return status_counts(self.trials)


def gather(store: Store, exp_id: int) -> ReportData:
    row = dict(store.experiment(exp_id))
    plan = parse(row["profile_text"], row["profile_path"])
    samples = store.samples_by_arm(exp_id)
    data = ReportData(exp_id, row, plan, workloads.get(plan.profile.workload),
                      store.trials(exp_id), store.environments(exp_id), samples,
                      verdicts.judge(plan, samples), store.attributions(exp_id))
    data.missing = _missing(data)
    return data


def _missing(d: ReportData) -> list[str]:
    out = []
    c = d.counts()
    not_run = c["planned"] + c["running"]
    if not_run:
        out.append(f"{not_run} of {len(d.trials)} trials did not run (interrupted); "
                   f"'mmlab experiment resume {d.exp_id}' finishes them")
    for t in d.trials:
        if t.status == "failed":
            out.append(f"trial {t.position} ({t.arm}) failed: {(t.error or '').split('; console')[0]}")
    for arm, ss in d.samples.items():
        if len(ss) < 3:
            out.append(f"arm {arm} has {len(ss)} samples; verdicts need 3")
    return out


def regzbot_lines(d: ReportData) -> list[str]:
    """`#regzbot introduced: A..B` for each regression whose arms differ only
    in the kernel."""
    out = []
    arms = {a.name: a for a in d.plan.arms}
    for c in d.judgement.comparisons:
        a, b = arms.get(c.arm), arms.get(c.baseline)
        if c.verdict != "regression" or not a or not b:
            continue
        if verdicts.Pair(a, b).differing_axes == {"kernel"}:
            line = f"#regzbot introduced: {_kernel_label(b.kernel)}..{_kernel_label(a.kernel)}"
            if line not in out:
                out.append(line)
    return out


def _kernel_label(name: str) -> str:
    if name == "host":
        return f"v{platform.release().split('-')[0]}"
    return name.split(":", 1)[1] if name.startswith("debian:") else name
