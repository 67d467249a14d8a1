"""Figures for reports (matplotlib, Agg backend, no display).

An experiment's, as PNG bytes: per metric, each arm's sample distribution,
and each comparison's ratio with its CI against the tolerance band.  Where
an axis is numeric: the metric against it, one line per value of the other
axes, with the growth exponent of a log-log fit (ksm-rmap's cost against the
VMA count; ~2 is quadratic).

The tracker's, as inline SVG with text as paths (no font is needed to show
it): one trend per series, the ratios on a log scale over each release's
step from the one before, each change marked by its number and linked to
its explanation.
"""

from __future__ import annotations

import io
import math
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib import ticker

from mmlab.report.data import ReportData
from mmlab.report.fmt import VERDICT_COLOR, change, contrast, printable, step
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
    ax.set_yticks(range(1, len(arms) + 1), [printable(a) for a in arms], fontsize=8)
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
        others = printable(",".join(f"{k}={v}" for k, v in arm.values.items() if k != axis)
                           or metric)
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


def marked(s: Series, changes: list[Change]) -> list[Change]:
    """The changes a series' trend marks, oldest first: the page numbers
    them in this order (1, 2, ...) beside the plot, whose marks are those
    numbers, as IDs side by side would overlap."""
    labels = [p.release.label for p in s.points]
    mine = [ch for ch in changes if ch.outcome in SHOWN and ch.after in labels
            and (ch.profile, ch.metric, ch.kind) == (s.profile, s.metric, s.kind)]
    return sorted(mine, key=lambda ch: labels.index(ch.after))


def trend(s: Series, reference: str, marks: list[Change]) -> str:
    """`trend_figure` as inline SVG, its text drawn as paths."""
    matplotlib.rcParams["svg.fonttype"] = "path"
    fig = trend_figure(s, reference, marks)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def trend_figure(s: Series, reference: str, marks: list[Change]):
    """One series in two panels.  Above, each release's ratio to
    the reference with its interval (hollow where the audit found another
    page state) on a log scale, where a -3% step is as tall at 1 as at
    0.02, the reference line, and each of `marks` (`marked`) a line with
    its number, linked to its explanation.  Below, each release's step from
    the one before: its axis ends past the second-largest step, so a -3%
    step shows beside a -98% one, whose bar is cut there and labelled.  A
    series of emulated time says so in its title."""
    fig, (top, below) = plt.subplots(2, 1, figsize=(7.5, 3.6), dpi=96, sharex=True,
                                     height_ratios=(2.2, 1))
    _ratios(top, s, reference)
    _steps(below, s, marks)
    labels = [p.release.label for p in s.points]
    for n, ch in enumerate(marks, 1):
        at = labels.index(ch.after) - 0.5
        artists = [ax.axvline(at, color=COLOURS[ch.outcome], linewidth=2, alpha=0.7)
                   for ax in (top, below)]
        artists.append(top.text(at, 0.95 - 0.12 * (n % 2 == 0), str(n), fontsize=9,
                                ha="center", va="top", color=COLOURS[ch.outcome], weight="bold",
                                transform=top.get_xaxis_transform(),
                                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1}))
        for artist in artists:
            artist.set_url(f"#change-{ch.id}")
    below.set_xticks(range(len(labels)), [_tick(p.release) for p in s.points], fontsize=7,
                     rotation=30)
    top.set_title(f"{s.profile}: {s.metric} ({s.kind}"
                  + (", emulated time)" if s.emulated else ")"), fontsize=9)
    fig.tight_layout()
    return fig


def _ratios(ax, s: Series, reference: str) -> None:
    """The ratios to the reference, on a log axis labelled as ratios (0.02,
    0.5, 1), not powers of ten."""
    x = range(len(s.points))
    ratios = [p.ratio for p in s.points]
    err = [[r - p.ci[0] if 0 < p.ci[0] <= r else 0 for r, p in zip(ratios, s.points)],
           [p.ci[1] - r if p.ci[1] >= r else 0 for r, p in zip(ratios, s.points)]]
    ax.axhline(1.0, color="#888", linewidth=1, linestyle="--")
    ax.errorbar(x, ratios, yerr=err, fmt="-", color="#1f5fa8", capsize=3, linewidth=1)
    state = [p.comparison is not None and p.comparison.verdict == "not comparable"
             for p in s.points]
    ax.scatter([i for i in x if not state[i]], [r for i, r in enumerate(ratios) if not state[i]],
               color="#1f5fa8", s=16, zorder=3)
    ax.scatter([i for i in x if state[i]], [r for i, r in enumerate(ratios) if state[i]],
               facecolors="white", edgecolors="#d68910", s=22, zorder=3)
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ax.yaxis.set_major_locator(ticker.MaxNLocator(5, steps=[1, 2, 5, 10]) if high / low < 4
                               else ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_locator(ticker.NullLocator())
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylabel(f"ratio to {reference}\n(log scale)", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)


def _steps(ax, s: Series, marks: list[Change]) -> None:
    """Each release's ratio over the previous release's, as a change, at the
    boundary between them (a marked change's as the tables state it,
    fmt.step: its confirmation's where it has one); the axis ends a quarter past the second-largest
    step (the largest where it is not twice that), at least at 5% (the
    verdicts' usual tolerance, so noise does not fill it), and a bar beyond
    is cut there and labelled with its value."""
    marked = {(ch.before, ch.after): ch for ch in marks}
    steps = np.array([step(marked[pair]) - 1 if pair in marked else b.ratio / a.ratio - 1
                      for a, b in zip(s.points, s.points[1:])
                      for pair in [(a.release.label, b.release.label)]])
    sizes = sorted(np.abs(steps[np.isfinite(steps)]), reverse=True) or [0.0]
    edge = sizes[1] if len(sizes) > 1 and sizes[0] > 2 * sizes[1] else sizes[0]
    edge = max(1.25 * edge, 0.05)
    at = np.arange(len(steps)) + 0.5
    ax.bar(at, np.clip(steps, -edge, edge), width=0.6, color="#7f8c9d")
    for x, size in zip(at, steps):
        if abs(size) > edge:
            ax.text(x + 0.35, np.sign(size) * edge * 0.6, f"{change(1 + size)} (cut)",
                    fontsize=7, ha="left", va="center", color="#333")
    ax.axhline(0, color="#888", linewidth=0.8)
    ax.set_ylim(-edge, edge)
    ax.yaxis.set_major_formatter(ticker.PercentFormatter(1.0))
    ax.set_ylabel("step from the\nrelease before", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)


def _tick(r) -> str:
    """A release's label, and its exact upstream version where it differs."""
    exact = r.name.removeprefix("debian:")
    return r.label if exact == r.label or not r.name.startswith("debian:") else \
        f"{r.label} ({exact})"
