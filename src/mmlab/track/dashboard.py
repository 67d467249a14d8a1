"""What the tracker's dashboard shows, as data: which outcomes it shows,
the changes newest first, and the changes one confirmation measured
together.  The text summary, the page, the feed and the JSON all order and
group the changes here, so they cannot disagree; report/ renders them."""

from __future__ import annotations

from mmlab.kernels.versions import VersionKey
from mmlab.track.changepoints import CONFIRMED
from mmlab.track.evidence import Evidence

SHOWN = (*CONFIRMED, "state change")


def newest_first(evidence: list[Evidence]) -> list[Evidence]:
    """By the later release's package version, newest first."""
    def key(e: Evidence) -> VersionKey:
        r = e.change.releases
        return VersionKey(r[1].version if r else e.change.after)
    return sorted(evidence, key=key, reverse=True)


def groups(evidence: list[Evidence]) -> list[list[Evidence]]:
    """The changes of one release pair of one profile and series together
    (one confirmation measured them all), newest pair first."""
    out: dict[tuple[str, str, str, str], list[Evidence]] = {}
    for e in newest_first(evidence):
        ch = e.change
        out.setdefault((ch.profile, ch.kind, ch.before, ch.after), []).append(e)
    return list(out.values())
