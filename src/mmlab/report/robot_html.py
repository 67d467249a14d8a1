"""A patch check as one HTML page: what the text report says (robot.py),
each change's subject as a heading, its table as a table, and links to
each confirmation's own report and evidence bundle where they were written
beside it (dashboard.write_evidence: evidence/ID.html, evidence/ID/); the
coverage (the changed functions and the paths that ran them) after them."""

from __future__ import annotations

from collections.abc import Set
from html import escape

from mmlab.check.session import CheckResult, Found
from mmlab.report import fmt, robot

STYLE = ("body{font-family:sans-serif;max-width:75em;margin:1em auto;padding:0 1em}"
         "pre{white-space:pre-wrap}table{border-collapse:collapse}"
         "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}"
         "td.m{text-align:left}.regression{color:#b00}.improvement{color:#070}")


def render(result: CheckResult, bundled: Set[int] = frozenset()) -> str:
    """The page; `bundled`: the confirmations whose report and bundle were
    written under evidence/ beside it."""
    title = f"mmlab check: {len(result.request.patches)} patch(es) on {result.base.name}"
    body = [f"<h1>{escape(title)}</h1>"]
    if not result.found:
        line = robot.failed(result) or robot.nothing(result) + robot.covered(result)
        body.append(f"<p>{escape(line)}</p>")
        body += _pre(robot.not_measured(result))
    for group in robot.groups(result.found):
        body += _group(result, group, bundled)
    if result.found:
        body += [*(["<h2>Coverage</h2>"] if result.coverage and result.coverage.functions
                   else []), *_pre(robot.coverage_lines(result))]
    if result.found and result.failed:
        body.append(f"<p>{escape(robot.failed(result))}</p>")
    return (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{escape(title)}"
            f"</title><style>{STYLE}</style></head><body>\n" + "\n".join(body)
            + "\n</body></html>\n")


def _pre(lines: list[str]) -> list[str]:
    return ["<pre>" + escape("\n".join(lines).rstrip()) + "</pre>"] if lines else []


def _group(result: CheckResult, group: list[Found], bundled: Set[int]) -> list[str]:
    out = [f"<h2 class=\"{escape(f.change.outcome)}\">{escape(robot.subject(result, f))}</h2>"
           for f in group]
    out.append("<pre>" + escape("\n".join(robot.about(result, group))) + "</pre>")
    out.append("<table><tr><th>base</th><th>%stddev</th><th>%change</th><th>patched</th>"
               "<th>%stddev</th><th>path</th></tr>")
    out += [f"<tr><td>{fmt.num(m.before)}</td><td>±{fmt.spread(m.spread_before)}</td>"
            f"<td class=\"{escape(m.outcome)}\">{fmt.change(m.ratio)}</td>"
            f"<td>{fmt.num(m.after)}</td><td>±{fmt.spread(m.spread_after)}</td>"
            f"<td class=\"m\">{escape(m.metric)} ({escape(m.outcome)})</td></tr>"
            for m in robot.rows(group)]
    out.append("</table>")
    moved = robot.functions(group)
    if moved:
        out.append("<pre>" + escape("\n".join(moved)) + "</pre>")
    if group[0].narrowing:
        out.append("<p>The patch, by bisection over the series' kernels:</p><pre>"
                   + escape("\n".join(line.strip() for line in group[0].narrowing)) + "</pre>")
    commands = [*group[0].evidence.commands.values(), f"({robot.BUNDLE})"]
    out.append("<p>To reproduce:</p><pre>" + escape("\n".join(commands)) + "</pre>")
    exp_id = group[0].change.evidence
    if exp_id in bundled:
        out.append(f"<p>The confirmation: <a href=\"evidence/{exp_id}.html\">its report</a>, "
                   f"<a href=\"evidence/{exp_id}/\">its evidence bundle</a>.</p>")
    return out
