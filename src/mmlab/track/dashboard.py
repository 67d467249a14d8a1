"""What the tracker's dashboard shows, as data: which outcomes it shows,
how many changes end in each, the changes newest first, and the changes one
confirmation measured together.  The text summary, the page, the feed and
the JSON all count, order and group the changes here, so they cannot
disagree; report/ renders them."""

from __future__ import annotations

from collections import Counter

from mmlab.kernels.versions import VersionKey
from mmlab.track.changepoints import ACROSS_BUILDS, CONFIRMED, EMULATED, Change
from mmlab.track.evidence import Evidence
from mmlab.track.suite import Suite

SHOWN = (*CONFIRMED, *EMULATED, "state change")     # explained in full, with their evidence
OUTCOMES = (*SHOWN, "unknown", ACROSS_BUILDS, "same", "candidate")   # in the order counted


def tally(changes: list[Change]) -> dict[str, int]:
    """How many changes end in each outcome, in OUTCOMES' order: emulated
    time is counted apart from the confirmed regressions and improvements,
    never among them."""
    found = Counter(c.outcome for c in changes)
    return {o: found[o] for o in OUTCOMES if found[o]}


def emulated(e: Evidence) -> bool:
    """An emulated time step: shown apart from the confirmed changes."""
    return e.change.outcome in EMULATED


def newest_first(evidence: list[Evidence]) -> list[Evidence]:
    """By the later release's package version, newest first."""
    def key(e: Evidence) -> VersionKey:
        r = e.change.releases
        return VersionKey(r[1].version if r else e.change.after)
    return sorted(evidence, key=key, reverse=True)


def release_notes(suite: Suite, evidence: list[Evidence]
                  ) -> list[tuple[str, dict[str, list[Evidence]]]]:
    """What each release changed in mm performance: every confirmed change
    and state change (not emulated time, not candidates) under the release
    it appeared in, newest release first, grouped by the mm area of its
    profile (the suite's `area`)."""
    area = {t.name: t.area for t in suite.profiles}
    out: dict[str, dict[str, list[Evidence]]] = {}
    for e in newest_first(evidence):
        if e.change.outcome in SHOWN and not emulated(e):
            areas = out.setdefault(e.change.after, {})
            areas.setdefault(area.get(e.change.profile, e.change.profile), []).append(e)
    return list(out.items())


def groups(evidence: list[Evidence]) -> list[list[Evidence]]:
    """The changes of one release pair of one profile and series together
    (one confirmation measured them all), newest pair first."""
    out: dict[tuple[str, str, str, str], list[Evidence]] = {}
    for e in newest_first(evidence):
        ch = e.change
        out.setdefault((ch.profile, ch.kind, ch.before, ch.after), []).append(e)
    return list(out.values())
