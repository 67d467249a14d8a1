"""JSON, as the commands print it and the tracker's dashboard writes it:
the records are gathered elsewhere (the judge, attribution/explain.py, the
probe, the census, the tracker); here they are written, one way each."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

from mmlab.track.dashboard import newest_first
from mmlab.track.evidence import Evidence
from mmlab.track.session import Result
from mmlab.track.suite import Suite


def track(suite: Suite, result: Result, evidence: list[Evidence]) -> str:
    """The series and the changes with their evidence; NaN as null."""
    return json.dumps(_finite({
        "suite": suite.name, "reference": asdict(result.reference),
        "series": [{"profile": s.profile, "metric": s.metric, "kind": s.kind,
                    "points": [{**asdict(p.release), "ratio": p.ratio, "ci": list(p.ci),
                                "verdict": str(p.comparison.verdict) if p.comparison
                                else "reference", "experiment": p.experiment}
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
