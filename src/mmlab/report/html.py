"""One self-contained HTML report, rendered from templates/report.html.j2:
inline CSS, plots as data: URIs, flame graphs as inline SVG; nothing is
fetched when it is opened."""

from __future__ import annotations

import base64

import jinja2
from markupsafe import Markup

from mmlab.judge.criteria import Verdict
from mmlab.report import flamegraph, fmt, plots, text
from mmlab.report.data import ReportData

TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("mmlab.report", "templates"),
    autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
TEMPLATES.filters.update(num=fmt.num, pct=fmt.pct, change=fmt.change, ratio=fmt.ratio, ci=fmt.ci,
                         p_value=fmt.p_value, signed=fmt.signed, verdict_class=fmt.verdict_class)


def data_uri(png: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(png).decode()}"


def render(d: ReportData) -> str:
    found = d.explanation
    return TEMPLATES.get_template("report.html.j2").render(
        d=d, profile=d.plan.profile, workload=d.workload,
        labels={(c.arm, c.baseline): fmt.contrast(d.plan, c.arm, c.baseline).label
                for c in d.judgement.comparisons},
        verdict_colors={fmt.verdict_class(v): fmt.VERDICT_COLOR[v] for v in Verdict},
        plots={name: data_uri(png) for name, png in plots.all_figures(d).items()},
        found=found, arms={a.arm: a for a in found.arms} if found else {},
        guests={g.arm: g for g in found.guests} if found else {},
        flames=[Markup(svg) for svg in flamegraph.graphs(found).values()] if found else [],
        report=text.render(d))
