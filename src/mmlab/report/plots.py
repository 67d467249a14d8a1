"""Figures for reports, as PNG bytes (matplotlib, Agg backend, no display).

Per metric: each arm's sample distribution, and each comparison's ratio with
its CI against the tolerance band.  Where an axis is numeric: the metric
against it, one line per value of the other axes, with the growth exponent
of a log-log fit (ksm-rmap's cost against the VMA count; ~2 is quadratic).
"""

from __future__ import annotations

import io
import math
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from mmlab.report.data import ReportData  # noqa: E402
from mmlab.report.fmt import VERDICT_COLOR, contrast  # noqa: E402


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def distributions(d: ReportData, metric: str) -> bytes:
    arms = [a for a, ss in d.samples.items() if ss]
    values = [[s.metrics.get(metric) for s in d.samples[a] if s.metrics.get(metric) is not None]
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
        vals = [s.metrics.get(metric) for s in d.samples.get(arm.name, [])
                if s.metrics.get(metric) is not None]
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
