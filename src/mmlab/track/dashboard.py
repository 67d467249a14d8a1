"""What a track run shows: a static dashboard (one trend plot per profile
and metric, inline SVG, change points marked and linked to their
explanation; an index of changes, newest first; an Atom feed), a text
summary in the style of a 0-day report, and JSON.

The page works from a file:// URL with no server and no network: the plots
are inline SVG drawn by matplotlib, the style is in the page, and there is
no script (asv's pages load their plotting code from a CDN and render
nothing offline).
"""

from __future__ import annotations

import io
import json
import math
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mmlab.track.cells import Series  # noqa: E402
from mmlab.track.changepoints import Change  # noqa: E402
from mmlab.track.session import Result  # noqa: E402
from mmlab.track.suite import Suite  # noqa: E402

TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("mmlab.track", "templates"),
                               autoescape=True, trim_blocks=True, lstrip_blocks=True)


def plot(s: Series, reference: str, changes: list[Change]) -> str:
    """One series as inline SVG: each release's ratio to the reference with
    its interval, the reference line, and confirmed changes marked."""
    x = list(range(len(s.points)))
    ratios = [p.ratio for p in s.points]
    lo = [p.ratio - (p.comparison.ci_low if p.comparison else 1) for p in s.points]
    hi = [(p.comparison.ci_high if p.comparison else 1) - p.ratio for p in s.points]
    fig, ax = plt.subplots(figsize=(7.5, 2.6), dpi=96)
    ax.axhline(1.0, color="#888", linewidth=1, linestyle="--", label=f"reference {reference}")
    ax.errorbar(x, ratios, yerr=[[max(v, 0) for v in lo], [max(v, 0) for v in hi]], fmt="o-",
                color="#1f5fa8", capsize=3, markersize=4)
    names = [p.kernel.removeprefix("debian:") for p in s.points]
    for ch in changes:
        if ch.confirmed and (ch.profile, ch.metric) == (s.profile, s.metric) and \
                ch.after in [p.kernel for p in s.points]:
            i = [p.kernel for p in s.points].index(ch.after)
            ax.axvline(i - 0.5, color="#c0392b" if ch.outcome == "regression" else "#27ae60",
                       linewidth=2, alpha=0.6)
            ax.annotate(ch.id, (i - 0.5, ax.get_ylim()[1]), fontsize=7, ha="center", va="top")
    ax.set_xticks(x, names, fontsize=7, rotation=30)
    ax.set_ylabel("ratio to reference", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title(f"{s.profile}: {s.metric}", fontsize=9)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def change_rows(suite: Suite, changes: list[Change]) -> list[dict]:
    """Each change as the table a maintainer knows from 0-day reports."""
    paths = {t.name: t.plan.path for t in suite.profiles}
    rows = []
    for ch in changes:
        c = ch.confirmation
        rows.append({"id": ch.id, "profile": ch.profile, "metric": ch.metric,
                     "before": ch.before, "after": ch.after, "outcome": ch.outcome,
                     "before_value": c.median_baseline if c else math.nan,
                     "after_value": c.median if c else math.nan,
                     "ratio": c.ratio if c else math.nan,
                     "ci": (c.ci_low, c.ci_high) if c else (math.nan, math.nan),
                     "cv": (c.rcv_baseline, c.rcv) if c else (math.nan, math.nan),
                     "reason": c.reason if c else "",
                     "command": f"mmlab narrow {paths[ch.profile]} --kernels "
                                f"{ch.before},{ch.after} --metric {ch.metric}"})
    return rows


def text(suite: Suite, result: Result) -> str:
    """What changed, in the style of a 0-day report."""
    lines = [f"mmlab track {suite.name}: {len(result.series)} series over "
             f"{len(suite.kernels)} kernels against {suite.reference}; "
             f"{len(result.measured)} cell(s) measured now, "
             f"{len(result.confirmations)} confirmation(s) run now", ""]
    confirmed = [r for r in change_rows(suite, result.changes) if r["outcome"] in ("regression",
                                                                             "improvement")]
    if not confirmed:
        lines.append("no confirmed change")
    for r in confirmed:
        lo, hi = r["ci"]
        lines += [f"[{r['id']}] {r['profile']}: {r['metric']} {r['outcome']} between "
                  f"{r['before']} and {r['after']}",
                  f"  {r['before']:<14} {r['before_value']:>14.6g}",
                  f"  {r['after']:<14} {r['after_value']:>14.6g}  {r['ratio'] - 1:+.1%} "
                  f"({lo:.3f}..{hi:.3f})",
                  f"  {r['reason']}", f"  reproduce: {r['command']}", ""]
    others = [r for r in change_rows(suite, result.changes) if r not in confirmed]
    for r in others:
        lines.append(f"candidate {r['id']} {r['profile']} {r['metric']} {r['before']}.."
                     f"{r['after']}: {r['outcome']}")
    return "\n".join(lines).rstrip() + "\n"


def to_json(suite: Suite, result: Result) -> dict:
    return {"suite": suite.name, "reference": suite.reference, "kernels": suite.kernels,
            "measured": result.measured, "confirmations": result.confirmations,
            "series": [{"profile": s.profile, "metric": s.metric,
                        "points": [{"kernel": p.kernel, "version": p.version, "ratio": p.ratio,
                                    "experiment": p.experiment} for p in s.points]}
                       for s in result.series],
            "changes": [{**r, "ci": list(r["ci"]), "cv": list(r["cv"])}
                        for r in change_rows(suite, result.changes)]}


def write(directory: Path, suite: Suite, result: Result) -> list[Path]:
    """index.html, feed.atom, summary.txt and track.json in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = change_rows(suite, result.changes)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    page = TEMPLATES.get_template("dashboard.html.j2").render(
        suite=suite, rows=rows, now=now,
        plots=[(s, plot(s, suite.reference, result.changes)) for s in result.series])
    feed = TEMPLATES.get_template("feed.atom.j2").render(
        suite=suite, now=now, rows=[r for r in rows if r["outcome"] in ("regression",
                                                                          "improvement")])
    out = {"index.html": page, "feed.atom": feed, "summary.txt": text(suite, result),
           "track.json": json.dumps(to_json(suite, result), indent=1, default=str)}
    for name, body in out.items():
        (directory / name).write_text(body)
    return [directory / name for name in out]

