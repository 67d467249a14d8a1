"""What a track run shows: a static dashboard (one trend plot per profile,
metric and series, inline SVG, each change point marked and linked to its
explanation; the changes newest first, each with its 0-day table, side
metrics, functions and commands), an Atom feed of confirmed changes, a text
summary in the style of a 0-day report, and JSON.

The page works from a file:// URL with no server and no network: the plots
are inline SVG drawn by matplotlib (text as paths, so no font is needed),
the style is in the page, and there is no script (asv's pages load their
plotting code from a CDN and render nothing offline).
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import asdict
from pathlib import Path

import jinja2
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mmlab.kernels.versions import VersionKey  # noqa: E402
from mmlab.report import bundle, data, html  # noqa: E402
from mmlab.store import Store  # noqa: E402
from mmlab.track.cells import Series  # noqa: E402
from mmlab.track.changepoints import CONFIRMED, Change  # noqa: E402
from mmlab.track.evidence import Evidence  # noqa: E402
from mmlab.track.session import TrackResult, metric_class  # noqa: E402
from mmlab.track.suite import Suite  # noqa: E402

TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("mmlab.track", "templates"),
                               autoescape=True, trim_blocks=True, lstrip_blocks=True)
TEMPLATES.filters["spread"] = lambda rcv: spread(rcv)
TEMPLATES.filters["metric_class"] = metric_class
COLOURS = {"regression": "#c0392b", "improvement": "#1e8449", "state change": "#d68910"}
SHOWN = (*CONFIRMED, "state change")


def newest_first(evidence: list[Evidence]) -> list[Evidence]:
    """By the later release's package version, newest first."""
    def key(e: Evidence) -> VersionKey:
        r = e.change.releases
        return VersionKey(r[1].version if r else e.change.after)
    return sorted(evidence, key=key, reverse=True)


def series_anchor(s: Series) -> str:
    return f"series-{s.profile}-{s.metric}-{s.kind}".replace(".", "_")


def plot(s: Series, reference: str, changes: list[Change]) -> str:
    """One series as inline SVG: each release's ratio to the reference with
    its interval (hollow where the audit found another page state), the
    reference line, and each change marked, linked to its explanation."""
    matplotlib.rcParams["svg.fonttype"] = "path"
    labels = [p.release.label for p in s.points]
    x = list(range(len(labels)))
    ratios = [p.ratio for p in s.points]
    err = [[max(r - p.ci[0], 0) if math.isfinite(p.ci[0]) else 0 for r, p in zip(ratios, s.points)],
           [max(p.ci[1] - r, 0) if math.isfinite(p.ci[1]) else 0 for r, p in zip(ratios, s.points)]]
    fig, ax = plt.subplots(figsize=(7.5, 2.6), dpi=96)
    ax.axhline(1.0, color="#888", linewidth=1, linestyle="--")
    ax.errorbar(x, ratios, yerr=err, fmt="-", color="#1f5fa8", capsize=3, linewidth=1)
    state = [p.comparison is not None and p.comparison.verdict == "not comparable"
             for p in s.points]
    ax.scatter([i for i in x if not state[i]], [r for i, r in enumerate(ratios) if not state[i]],
               color="#1f5fa8", s=16, zorder=3)
    ax.scatter([i for i in x if state[i]], [r for i, r in enumerate(ratios) if state[i]],
               facecolors="white", edgecolors="#d68910", s=22, zorder=3)
    ax.text(0.995, 0.02, f"reference {reference}", transform=ax.transAxes, fontsize=7,
            color="#666", ha="right")
    top = ax.get_ylim()[1]
    for ch in changes:
        if (ch.profile, ch.metric, ch.kind) != (s.profile, s.metric, s.kind) or \
                ch.outcome not in SHOWN or ch.after not in labels:
            continue
        at = labels.index(ch.after) - 0.5
        line = ax.axvline(at, color=COLOURS[ch.outcome], linewidth=2, alpha=0.7)
        mark = ax.text(at, top, ch.id, fontsize=7, ha="center", va="top",
                       color=COLOURS[ch.outcome])
        for artist in (line, mark):
            artist.set_url(f"#change-{ch.id}")
    ax.set_xticks(x, [_tick(p.release) for p in s.points], fontsize=7, rotation=30)
    ax.set_ylabel("ratio to reference", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title(f"{s.profile}: {s.metric} ({s.kind})", fontsize=9)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def spread(rcv: float) -> str:
    """A robust CV as a percentage, with the digits a count's needs."""
    if not math.isfinite(rcv):
        return "?"
    return f"{rcv:.2%}" if rcv < 0.001 else f"{rcv:.1%}"


def _tick(r) -> str:
    """A release's label, and its exact upstream version where it differs."""
    exact = r.name.removeprefix("debian:")
    return r.label if exact == r.label or not r.name.startswith("debian:") else \
        f"{r.label} ({exact})"


def _spread(value: float, rcv: float) -> str:
    return f"{value:.6g} ±{spread(rcv)}"


def groups(evidence: list[Evidence]) -> list[list[Evidence]]:
    """The changes of one release pair of one profile and series together
    (one confirmation measured them all), newest pair first."""
    out: dict[tuple[str, str, str, str], list[Evidence]] = {}
    for e in newest_first(evidence):
        ch = e.change
        out.setdefault((ch.profile, ch.kind, ch.before, ch.after), []).append(e)
    return list(out.values())


def pair_lines(group: list[Evidence]) -> list[str]:
    """One release pair as a 0-day report gives it: each change's headline,
    the two releases, each metric on both with its spread and the change,
    side metrics, functions, and the commands."""
    e = group[0]
    ch = e.change
    out = [f"[{g.change.id}] {ch.profile}: {_pct(g)} {g.change.outcome} of {g.change.metric}"
           for g in group]
    confirmed = {g.change.evidence: g for g in group if g.rounds}
    out += [f"  between {e.before} and {e.after} (series {ch.kind}"
            + "".join(f", {metric_class(g.change.metric)} in {g.rounds} rounds" for g in
                      confirmed.values())
            + (f", confirmed {e.confirmed_at})" if confirmed else ")"), ""]
    if e.metrics:
        w = max(16, *(len(_spread(m.after, m.spread_after)) for m in e.metrics))
        out.append(f"  {e.before.split()[0]:>{w}}  {'':>8}  {e.after.split()[0]:>{w}}")
        out.append(f"  {'-' * w}  {'-' * 8}  {'-' * w}")
        for m in e.metrics:
            out.append(f"  {_spread(m.before, m.spread_before):>{w}}  {m.ratio - 1:>+8.1%}  "
                       f"{_spread(m.after, m.spread_after):>{w}}  {m.metric} "
                       f"({m.ci[0]:.3f}..{m.ci[1]:.3f}, {m.outcome})")
        out.append("")
    for v in e.vmstat:
        out.append(f"  vmstat {v.counter}: {v.per_unit_baseline:.4g} -> {v.per_unit:.4g} per unit")
    for s in e.state:
        if s.before != s.after:
            out.append(f"  page state {s.key}: {s.before} -> {s.after}")
    out += [f"  audit: {f}" for f in e.findings]
    for wf in e.functions:
        rows = ", ".join(f"{r.function} {r.change:+.4g}" for r in wf.rows[:5]) or "no change"
        out.append(f"  functions ({wf.window}, kernel instructions per {wf.unit}): {rows}")
    out += [f"  {name}: {cmd}" for name, cmd in e.commands.items()]
    return out + [""]


def _pct(e: Evidence) -> str:
    m = next((m for m in e.metrics if m.metric == e.change.metric), None)
    return f"{m.ratio - 1:+.1%}" if m else f"{e.change.candidate_ratio - 1:+.1%} (cells)"


def text(suite: Suite, result: TrackResult, evidence: list[Evidence], only_new: bool = False) -> str:
    """What changed, in the style of a 0-day report: every confirmed change
    or state change (with `only_new`, those whose confirmation ran now),
    one entry per release pair, then the other candidates in a line each."""
    ref = result.reference
    now = (f"{result.cells} cell(s) in {len(result.measured)} experiment(s) and "
           f"{len(result.confirmations)} confirmation(s) measured now; " if only_new else "")
    releases = len({p.release for s in result.series for p in s.points})
    lines = [f"mmlab track {suite.name}: {now}{len(result.series)} series over {releases} "
             f"releases, against {ref.name} ({ref.version})", ""]
    shown = [e for e in evidence if e.change.outcome in SHOWN
             and (not only_new or e.change.evidence in result.confirmations)]
    for group in groups(shown):
        lines += pair_lines(group)
    if not shown:
        lines += ["no new confirmed change" if only_new else "no confirmed change", ""]
    for e in newest_first(evidence):
        if e.change.outcome not in SHOWN:
            ch = e.change
            lines.append(f"candidate {ch.id} {ch.profile} {ch.metric} ({ch.kind}) "
                         f"{ch.before}..{ch.after}: {ch.outcome}")
    return "\n".join(lines).rstrip() + "\n"


def to_json(suite: Suite, result: TrackResult, evidence: list[Evidence]) -> dict:
    """The series and the changes with their evidence; NaN as null."""
    return _finite({
        "suite": suite.name, "reference": asdict(result.reference),
        "series": [{"profile": s.profile, "metric": s.metric, "kind": s.kind,
                    "points": [{**asdict(p.release), "ratio": p.ratio, "ci": list(p.ci),
                                "verdict": str(p.comparison.verdict) if p.comparison
                                else "reference", "experiment": p.experiment}
                               for p in s.points]} for s in result.series],
        "changes": [asdict(e) for e in newest_first(evidence)]})


def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


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
          generated: str, bundled: set[int] = frozenset()) -> list[Path]:
    """index.html, feed.atom, summary.txt and track.json in `directory`;
    `bundled`: the experiments write_evidence wrote, linked from their change."""
    directory.mkdir(parents=True, exist_ok=True)
    ordered = newest_first(evidence)
    page = TEMPLATES.get_template("dashboard.html.j2").render(
        suite=suite, result=result, evidence=ordered, groups=groups(evidence), now=generated,
        shown=SHOWN, bundled=bundled,
        plots=[(series_anchor(s), plot(s, result.reference.name, result.changes))
               for s in result.series if len(s.points) > 1])
    feed = TEMPLATES.get_template("feed.atom.j2").render(
        suite=suite, now=generated, evidence=[e for e in ordered if e.change.confirmed])
    out = {"index.html": page, "feed.atom": feed, "summary.txt": text(suite, result, evidence),
           "track.json": json.dumps(to_json(suite, result, evidence), indent=1, default=str)}
    for name, body in out.items():
        (directory / name).write_text(body)
    return [directory / name for name in out]
