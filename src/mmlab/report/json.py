"""JSON, as the commands print it (`--json`) and the tracker's dashboard
writes it: the records are gathered elsewhere (the judge,
attribution/explain.py, the probe, the kernel cache and catalog, the
tracker); here they are written, one way each.  Pydantic records (a
sample, a census) are their own schema and print themselves
(model_dump_json)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict

from mmlab.attribution.explain import Explanation
from mmlab.check.session import CheckResult
from mmlab.experiment.plan import Plan
from mmlab.judge.verdicts import Judgement
from mmlab.kernels.images import Kernel
from mmlab.report import auditnotes, robot
from mmlab.track.dashboard import newest_first, tally
from mmlab.track.evidence import Evidence
from mmlab.track.session import TrackResult
from mmlab.track.suite import Suite
from mmlab.workloads.samples import Sample


def records(rows: Iterable) -> str:
    """Dataclass records (workloads, the probe's facts, the catalog's
    entries) as a list of objects."""
    return json.dumps([asdict(r) for r in rows], indent=1)


def comparisons(plan: Plan, judged: Judgement, samples: Mapping[str, Sequence[Sample]]) -> str:
    """Each comparison with every field (Comparison.as_dict), whether its
    figures are emulated time, what a counted one counts and the audit's
    findings on its pair (auditnotes.fields)."""
    return json.dumps([{**c.as_dict(), "emulated": judged.emulated_time(plan, c),
                        **auditnotes.fields(plan, judged, samples, c)}
                       for c in judged.comparisons], indent=1)


def explanation(found: Explanation) -> str:
    return json.dumps(found.to_json(), indent=1)


def kernels(found: list[Kernel]) -> str:
    """The cached kernels, each as its summary."""
    return json.dumps([k.summary() for k in found], indent=1)


def track(suite: Suite, result: TrackResult, evidence: list[Evidence]) -> str:
    """The series and the changes with their evidence, and how many changes
    end in each outcome (emulated time apart); NaN as null."""
    return json.dumps(_finite({
        "suite": suite.name, "reference": asdict(result.reference),
        "tally": tally(result.changes),
        "series": [{"profile": s.profile, "metric": s.metric, "kind": s.kind,
                    "points": [{**asdict(p.release), "ratio": p.ratio, "ci": list(p.ci),
                                "verdict": str(p.comparison.verdict) if p.comparison
                                else "reference", "experiment": p.experiment,
                                "emulated": p.emulated}
                               for p in s.points]} for s in result.series],
        "changes": [asdict(e) for e in newest_first(evidence)]}), indent=1, default=str)


def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def check(result: CheckResult) -> str:
    """A patch check, as its text report says it (robot.record); NaN as null."""
    return json.dumps(_finite(robot.record(result)), indent=1, default=str) + "\n"
