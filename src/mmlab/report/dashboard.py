"""The tracker's dashboard as a directory of files: index.html, feed.atom,
summary.txt and track.json, rendered by the format modules (html, text,
json), one page per release under releases/ (what it changed in mm
performance, by area), and under evidence/ each shown change's confirmation as mmlab's HTML
report and evidence bundle."""

from __future__ import annotations

from collections.abc import Set
from pathlib import Path

from mmlab.names import safe_name
from mmlab.report import bundle, data, html, text
from mmlab.report import json as report_json
from mmlab.store import Store
from mmlab.track import dashboard
from mmlab.track.dashboard import SHOWN
from mmlab.track.evidence import Evidence
from mmlab.track.session import TrackResult
from mmlab.track.suite import Suite


def write_evidence(store: Store, directory: Path, evidence: list[Evidence]) -> set[int]:
    """Each shown change's confirmation as mmlab's HTML report
    (DIR/evidence/ID.html) and evidence bundle (DIR/evidence/ID/: README.md,
    raw data, reproducers, MANIFEST.sha256); returns the experiments written."""
    done = set()
    for e in evidence:
        exp_id = e.change.evidence
        if exp_id is None or exp_id in done or e.change.outcome not in SHOWN:
            continue
        d = data.gather(store, exp_id)
        bundle.write(d, directory / "evidence" / str(exp_id))
        (directory / "evidence" / f"{exp_id}.html").write_text(html.render(d))
        done.add(exp_id)
    return done


def write(directory: Path, suite: Suite, result: TrackResult, evidence: list[Evidence],
          generated: str, bundled: Set[int] = frozenset()) -> list[Path]:
    """index.html, feed.atom, summary.txt and track.json in `directory`;
    `bundled`: the experiments write_evidence wrote, linked from their change."""
    directory.mkdir(parents=True, exist_ok=True)
    out = {"index.html": html.dashboard(suite, result, evidence, generated, bundled),
           "feed.atom": html.feed(suite, evidence, generated),
           "summary.txt": text.track_summary(suite, result, evidence),
           "track.json": report_json.track(suite, result, evidence)}
    for release, areas in dashboard.release_notes(suite, evidence):
        out[f"releases/{safe_name(release)}.txt"] = text.release_note(suite, release, areas)
    (directory / "releases").mkdir(exist_ok=True)
    for name, body in out.items():
        (directory / name).write_text(body)
    return [directory / name for name in out]
