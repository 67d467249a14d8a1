"""Figures for reports (matplotlib, Agg backend, no display).

An experiment's, as PNG bytes: per metric, each arm's sample distribution,
and each comparison's ratio with its CI against the tolerance band.  Where
an axis is numeric: the metric against it, one line per value of the other
axes, with the growth exponent of a log-log fit (ksm-rmap's cost against the
VMA count; ~2 is quadratic).

The tracker's, as inline SVG with text as paths (no font is needed to show
it): one trend per series, each change marked and linked to its explanation.
"""

from __future__ import annotations

import io
import math
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from mmlab.report.data import ReportData
from mmlab.report.fmt import VERDICT_COLOR, contrast
from mmlab.track.cells import Series
from mmlab.track.changepoints import EMULATED, Change
from mmlab.track.dashboard import SHOWN

COLOURS = {"regression": "#c0392b", "improvement": "#1e8449", "state change": "#d68910",
           **dict.fromkeys(EMULATED, "#7d3c98")}


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def distributions(d: ReportData, metric: str) -> bytes:
    arms = [a for a, ss in d.samples.items() if ss]
    values = [[x for s in d.samples[a] if (x := s.metrics.get(metric)) is not None]
              for a in arms]
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * max(len(arms), 1)))
    if any(values):
        ax.boxplot([v or [math.nan] for v in values], orientation="horizontal", widths=0.5)
        rng = np.random.default_rng(0)
        for i, v in enumerate(values, 1):
            ax.scatter(v, i + rng.uniform(-0.12, 0.12, len(v)), s=10, alpha=0.7, color="C1")
    ax.set_yticks(range(1, len(arms) + 1), arms, fontsize=8)
    ax.set_xlabel(metric)
    ax.set_title(f"{metric}: samples per arm")
    return _png(fig)


def ratios(d: ReportData, metric: str) -> bytes:
    comps = [c for c in d.judgement.comparisons if c.metric == metric and math.isfinite(c.ratio)]
    fig, ax = plt.subplots(figsize=(8, 0.6 + 0.45 * max(len(comps), 1)))
    tol = d.plan.profile.tolerance
    ax.axvspan(1 - tol, 1 + tol, color="0.9", label=f"±{tol:.0%} (no change)")
    ax.axvline(1, color="0.5", lw=0.8)
    for i, c in enumerate(comps):
        lo, hi = c.ci_low, c.ci_high
        ax.errorbar([c.ratio], [i], xerr=[[c.ratio - lo], [hi - c.ratio]], fmt="o", capsize=3,
                    color=VERDICT_COLOR[c.verdict])
    ax.set_yticks(range(len(comps)), [contrast(d.plan, c.arm, c.baseline).label for c in comps],
                  fontsize=8)
    ax.set_xlabel("ratio (arm / baseline) and its CI")
    ax.set_title(f"{metric}: ratios")
    ax.legend(loc="lower right", fontsize=8)
    return _png(fig)


def numeric_axes(d: ReportData) -> list[str]:
    m = d.plan.profile.matrix
    return [a for a, vals in m.items() if len(vals) >= 2
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals)]


def growth_exponent(xs: list[float], ys: list[float]) -> float:
    """Slope of log(y) against log(x): 1 linear, 2 quadratic."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y and y > 0]
    if len(pts) < 2:
        return math.nan
    lx, ly = zip(*pts)
    return float(np.polyfit(lx, ly, 1)[0])


def scaling(d: ReportData, metric: str, axis: str) -> bytes:
    lines: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for arm in d.plan.arms:
        vals = [x for s in d.samples.get(arm.name, [])
                if (x := s.metrics.get(metric)) is not None]
        if not vals:
            continue
        others = ",".join(f"{k}={v}" for k, v in arm.values.items() if k != axis) or metric
        lines[others].append((float(arm.values[axis]), float(np.median(vals))))
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, pts in lines.items():
        pts.sort()
        xs, ys = zip(*pts)
        k = growth_exponent(list(xs), list(ys))
        ax.plot(xs, ys, "o-", label=f"{label} (exponent {k:.2f})" if math.isfinite(k) else label)
    if lines and all(y > 0 for pts in lines.values() for _, y in pts):
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel(axis)
    ax.set_ylabel(f"{metric} (median)")
    ax.set_title(f"{metric} against {axis} (log-log; the exponent is the fitted slope)")
    ax.legend(fontsize=8)
    return _png(fig)


def all_figures(d: ReportData) -> dict[str, bytes]:
    """name -> PNG, for the HTML report and the bundle alike."""
    figs = {}
    for metric in d.plan.profile.metrics:
        figs[f"{metric}-samples"] = distributions(d, metric)
        figs[f"{metric}-ratios"] = ratios(d, metric)
        for axis in numeric_axes(d):
            figs[f"{metric}-vs-{axis}"] = scaling(d, metric, axis)
    return figs


def trend(s: Series, reference: str, changes: list[Change]) -> str:
    """One series as inline SVG: each release's ratio to the reference with
    its interval (hollow where the audit found another page state), the
    reference line, and each change marked, linked to its explanation; a
    series of emulated time says so in its title."""
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
    ax.set_title(f"{s.profile}: {s.metric} ({s.kind}"
                 + (", emulated time)" if s.emulated else ")"), fontsize=9)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _tick(r) -> str:
    """A release's label, and its exact upstream version where it differs."""
    exact = r.name.removeprefix("debian:")
    return r.label if exact == r.label or not r.name.startswith("debian:") else \
        f"{r.label} ({exact})"
