"""One self-contained HTML report: inline CSS, plots as data: URIs, flame
graphs as inline SVG; nothing is fetched when it is opened."""

from __future__ import annotations

import base64
import tempfile
from html import escape
from pathlib import Path

from .. import verdicts
from ..attribution import explain
from . import plots, text
from .data import ReportData

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1250px; color: #222; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; font-size: 12px; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
td:first-child, th:first-child, td:last-child { text-align: left; }
.regression { color: #b00; font-weight: bold; } .improvement { color: #070; font-weight: bold; }
.unreliable { color: #a60; } .not-comparable { color: #808; font-weight: bold; }
img { max-width: 100%; } .flame { overflow-x: auto; border: 1px solid #ddd; margin: 1em 0; }
"""


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _verdict_table(d: ReportData) -> str:
    rows = []
    for c in d.judgement.comparisons:
        cls = c.verdict.replace(" ", "-")
        rows.append(f"<tr><td>{escape(c.metric)}</td><td>{escape(c.arm)}</td>"
                    f"<td>{escape(c.baseline)}</td><td>{text._num(c.median_baseline)}</td>"
                    f"<td>{text._num(c.median)}</td><td>{c.ratio:.3f}</td>"
                    f"<td>{c.ci_low:.3f}..{c.ci_high:.3f}</td><td>{c.p_value:.2g}</td>"
                    f'<td class="{cls}">{escape(c.verdict)}</td><td>{escape(c.reason)}</td></tr>')
    return ("<table><tr><th>metric</th><th>arm</th><th>baseline</th><th>baseline median</th>"
            "<th>arm median</th><th>ratio</th><th>95% CI</th><th>p</th><th>verdict</th>"
            "<th>reason</th></tr>" + "".join(rows) + "</table>")


def _attribution(d: ReportData) -> str:
    if not d.attributions:
        return "<p>No attribution trials (run the experiment with --attribute).</p>"
    found = explain.explain_experiment(d.plan, d.attributions, d.samples,
                                       d.plan.profile.focus, n=10)
    guests = {g.arm: g for g in found.guests}
    arms = {x.arm: x for x in found.arms}
    parts = []
    for a in d.attributions:
        ex = arms.get(a)
        if ex and ex.top:
            rows = "".join(f"<tr><td>{escape(f.function)}</td><td>{f.inclusive:.1%}</td>"
                           f"<td>{f.self_share:.1%}</td></tr>" for f in ex.top)
            parts.append(f"<h3>{escape(a)}: top functions (perf cpu-clock)</h3><table><tr>"
                         f"<th>function</th><th>inclusive</th><th>self</th></tr>{rows}</table>")
        if ex and ex.callers:
            rows = "".join(f"<tr><td>{escape(c)}</td><td>{n}</td><td>{us:,.1f}</td></tr>"
                           for c, n, us in ex.callers)
            parts.append(f"<h3>{escape(a)}: lock contention callers</h3><table><tr><th>caller"
                         f"</th><th>seen</th><th>est. wait us</th></tr>{rows}</table>")
        g = guests.get(a)
        if g:
            rows = "".join(f"<tr><td>{fig}</td><td>{escape(fn)}</td><td>{v:,.0f}</td></tr>"
                           for fig, fn, v, _ in g.rows)
            parts.append(f"<h3>{escape(a)}: in-guest trace ({g.accelerator})</h3><table><tr>"
                         f"<th>figure</th><th>function</th><th>value</th></tr>{rows}</table>")
    with tempfile.TemporaryDirectory() as tmp:
        for svg in explain.write_flamegraphs(Path(tmp), d.attributions,
                                             list(verdicts.pairs(d.plan)), d.plan.profile.focus):
            parts.append(f'<div class="flame">{svg.read_text()}</div>')
    return "".join(parts)


def render(d: ReportData) -> str:
    p = d.plan.profile
    figs = plots.all_figures(d)
    plot_html = "".join(_img(png, name) for name, png in figs.items())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>mmlab: {escape(p.name)}</title><style>{STYLE}</style></head><body>
<h1>{escape(p.name)}</h1>
<p>{escape(p.description or d.workload.summary)}</p>
<h2>Verdicts</h2>{_verdict_table(d)}
<h2>Plots</h2>{plot_html}
<h2>Where the time went</h2>{_attribution(d)}
<h2>The mailing-list report</h2><pre>{escape(text.render(d))}</pre>
<h2>Profile</h2><pre>{escape(d.row["profile_text"])}</pre>
</body></html>
"""
