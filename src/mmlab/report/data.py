"""Everything a report says, gathered once from the store.

Text, HTML and bundles render the same ReportData, so they cannot disagree.
It works on interrupted or partly failed experiments: what is missing is
listed in words instead of failing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mmlab import workloads
from mmlab.attribution import explain
from mmlab.experiment.plan import Pair, Plan
from mmlab.judge import verdicts
from mmlab.judge.comparison import Comparison
from mmlab.judge.criteria import Verdict
from mmlab.judge.stats import MIN_SAMPLES
from mmlab.store import Store, Trial, status_counts
from mmlab.workloads.samples import Sample


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
    attributions: dict[str, explain.Attribution]
    explanation: explain.Explanation | None     # None without attribution trials
    missing: list[str] = field(default_factory=list)

    @property
    def accelerators(self) -> set[str]:
        return {str(s.state.get("accelerator")) for ss in self.samples.values() for s in ss
                if "accelerator" in s.state}

    def emulated(self, c: Comparison) -> bool:
        """The comparison's figures are emulated time."""
        return self.judgement.emulated_time(self.plan, c)

    def counts(self) -> dict[str, int]:
        return status_counts(self.trials)


EXPLAIN_TOP = 10     # functions, events and deltas a report shows at most


def gather(store: Store, exp_id: int) -> ReportData:
    """Only what the store holds: the stored plan (no profile parsing, no
    mmwork), the trials' stored environments, samples and attribution."""
    row = dict(store.experiment(exp_id))
    plan = store.plan(exp_id)
    measured = store.measurements(exp_id)       # samples with their rounds: paired verdicts
    samples = measured.by_arm
    attributions = explain.load(store.attributions(exp_id))
    found = explain.explain_experiment(plan, attributions, samples, plan.profile.focus,
                                       n=EXPLAIN_TOP) if attributions else None
    data = ReportData(exp_id, row, plan, plan.workload,
                      store.trials(exp_id), store.environments(exp_id), samples,
                      verdicts.judge(plan, measured), attributions, found)
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
            why = (t.error or "").split("; console")[0]
            out.append(f"trial {t.position} ({t.arm}) failed: {why}")
    for arm, ss in d.samples.items():
        if len(ss) < MIN_SAMPLES:
            out.append(f"arm {arm} has {len(ss)} samples; verdicts need {MIN_SAMPLES}")
    return out


def regzbot_lines(d: ReportData) -> list[str]:
    """`#regzbot introduced: A..B` for each regression whose arms differ only
    in the kernel."""
    out = []
    for c in d.judgement.comparisons:
        if c.verdict != Verdict.REGRESSION:
            continue
        a, b = d.plan.arm(c.arm), d.plan.arm(c.baseline)
        if Pair(a, b).differing_axes == {"kernel"}:
            line = (f"#regzbot introduced: "
                    f"{_kernel_label(d, b.kernel)}..{_kernel_label(d, a.kernel)}")
            if line not in out:
                out.append(line)
    return out


def _kernel_label(d: ReportData, name: str) -> str:
    """A kernel as regzbot names it; the host's is the release the trials
    recorded (every trial's environment has it), not the one running the report."""
    if name == "host":
        release = d.environments[0].get("kernel", "?") if d.environments else "?"
        return f"v{release.split('-')[0]}"
    return name.split(":", 1)[1] if name.startswith("debian:") else name
