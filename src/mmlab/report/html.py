"""HTML, self-contained: nothing is fetched when a page is opened, and
there is no script.  An experiment's report (templates/report.html.j2:
inline CSS, plots as data: URIs, flame graphs as inline SVG), and the
tracker's dashboard (templates/dashboard.html.j2: one trend plot per
profile, metric and series as inline SVG, each change point linked to its
explanation; the changes newest first) with its Atom feed of confirmed
changes (templates/feed.atom.j2).  Both work from a file:// URL with no
server and no network (asv's pages load their plotting code from a CDN and
render nothing offline)."""

from __future__ import annotations

import base64
from collections.abc import Set

import jinja2
from markupsafe import Markup

from mmlab.judge.criteria import Verdict
from mmlab.names import safe_name
from mmlab.report import flamegraph, fmt, plots, text
from mmlab.report.data import ReportData
from mmlab.track.cells import Series
from mmlab.track.changepoints import CONFIRMED, EMULATED
from mmlab.track.dashboard import emulated, groups, newest_first, release_notes, tally
from mmlab.track.evidence import Evidence
from mmlab.track.session import TrackResult
from mmlab.track.suite import Suite


def shown(value: object) -> object:
    """Every value a page shows, as `fmt.printable` writes it (line breaks
    and tabs kept, for the blocks of text: the report, the profile); markup
    of mmlab's own (plots, flame graphs) as it is."""
    return value if isinstance(value, Markup) or not isinstance(value, str) else \
        fmt.printable(value, keep="\n\t")


TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("mmlab.report", "templates"), finalize=shown,
    autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
TEMPLATES.filters.update(num=fmt.num, pct=fmt.pct, change=fmt.change, ratio=fmt.ratio, ci=fmt.ci,
                         p_value=fmt.p_value, signed=fmt.signed, verdict_class=fmt.verdict_class,
                         verdict_label=fmt.verdict_label, beside_trials=fmt.beside_trials,
                         call_path=fmt.call_path)
# The dashboard's templates test for values a change may lack, so undefined is no error.
DASHBOARD = jinja2.Environment(loader=jinja2.PackageLoader("mmlab.report", "templates"),
                               finalize=shown, autoescape=True, trim_blocks=True,
                               lstrip_blocks=True)


def outcome_class(outcome: str) -> str:
    """The CSS class of a tracker's outcome: emulated time has its own."""
    if outcome in EMULATED:
        return "emulated"
    if outcome == "state change":
        return "state"
    return outcome if outcome in CONFIRMED else "quiet"


def reason(e: Evidence) -> str:
    """What decided a change, in words: its confirmation's reason, and first,
    where the tracker's outcome is not the verdict's, why (a +2.9% count
    step is a regression, though its verdict said "no change")."""
    said = e.change.confirmation.reason if e.change.confirmation else ""
    m = next((m for m in e.metrics if m.metric == e.change.metric), None)
    if m and m.why:
        return f"{m.why}; the verdict said {m.verdict} ({said})" if said else m.why
    return said


DASHBOARD.filters.update(num=fmt.num, value=fmt.value, signed=fmt.signed, change=fmt.change,
                         step=fmt.step, ci=fmt.ci, spread=fmt.spread, outcome_class=outcome_class,
                         reason=reason, safe_name=safe_name, call_path=fmt.call_path)


def data_uri(png: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(png).decode()}"


def render(d: ReportData) -> str:
    found = d.explanation
    return TEMPLATES.get_template("report.html.j2").render(
        d=d, profile=d.plan.profile, workload=d.workload, summary=fmt.summary(d.plan),
        labels={(c.arm, c.baseline): fmt.contrast(d.plan, c.arm, c.baseline).label
                for c in d.judgement.comparisons},
        verdict_colors={fmt.verdict_class(v): fmt.VERDICT_COLOR[v] for v in Verdict},
        counted=fmt.count_legend(d.workload, d.plan.profile.metrics, d.samples),
        functions_legend=fmt.FUNCTIONS_LEGEND,
        plots={name: data_uri(png) for name, png in plots.all_figures(d).items()},
        found=found, arms={a.arm: a for a in found.arms} if found else {},
        guests={g.arm: g for g in found.guests} if found else {},
        flames=[Markup(svg) for svg in flamegraph.graphs(found).values()] if found else [],
        report=text.render(d))


def series_anchor(s: Series) -> str:
    return f"series-{s.profile}-{s.metric}-{s.kind}".replace(".", "_")


def dashboard(suite: Suite, result: TrackResult, evidence: list[Evidence], generated: str,
              bundled: Set[int]) -> str:
    """The tracker's page; `bundled`: the experiments whose report and
    bundle were written beside it, linked from their change."""
    ordered = newest_first(evidence)
    return DASHBOARD.get_template("dashboard.html.j2").render(
        suite=suite, result=result, tally=tally(result.changes),
        confirmed=[e for e in ordered if not emulated(e)],
        emulated=[e for e in ordered if emulated(e)], groups=groups(evidence),
        notes=release_notes(suite, evidence),
        now=generated, bundled=bundled,
        plots=[(series_anchor(s), plots.trend(s, result.reference.name, marks), s.emulated,
                marks) for s in result.series if len(s.points) > 1
               for marks in [plots.marked(s, result.changes)]])


def feed(suite: Suite, evidence: list[Evidence], generated: str) -> str:
    """The confirmed changes as an Atom feed, newest first."""
    return DASHBOARD.get_template("feed.atom.j2").render(
        suite=suite, now=generated,
        evidence=[e for e in newest_first(evidence) if e.change.confirmed])
