"""The plain-text report for a mailing list: at most 80 columns, no colour.

Per metric, comparisons that contrast the same two values (debian:6.1 vs
debian:6.12) form one table with a row per value of the other axes, the
layout such reports use:

    cpus   debian:6.1  debian:6.12   change   ratio  95% CI        verdict
"""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict

from ..attribution import explain
from ..stats import Comparison, summarize
from .data import ReportData, regzbot_lines
from .terminal import fmt

WIDTH = 80
MIN_LOCK_SEEN = 10      # fewer contentions than this are background, not the workload


def _split(name: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in name.split(",")) if "=" in name else {}


def _contrast(c: Comparison) -> tuple[str, str, str, str]:
    """(axes compared, baseline value, arm value, the other axes' values)."""
    a, b = _split(c.arm), _split(c.baseline)
    if not a or a.keys() != b.keys():
        return ("arm", c.baseline, c.arm, "")
    differ = [k for k in a if a[k] != b[k]]
    shared = ",".join(f"{k}={a[k]}" for k in a if k not in differ)
    return (",".join(differ), ",".join(b[k] for k in differ), ",".join(a[k] for k in differ),
            shared)


def _num(x: float) -> str:
    return "-" if not math.isfinite(x) else fmt(x)


def results(d: ReportData) -> list[str]:
    lines = []
    for metric in d.plan.profile.metrics:
        m = d.workload.metric(metric)
        comps = [c for c in d.judgement.comparisons if c.metric == metric]
        lines += ["", f"{metric} ({m.unit}, {m.direction} is better), medians:"]
        groups: dict[tuple, list[tuple[str, Comparison]]] = defaultdict(list)
        for c in comps:
            axes, base, arm, shared = _contrast(c)
            groups[(axes, base, arm)].append((shared, c))
        for (axes, base, arm), rows in groups.items():
            label_w = max([len(s) for s, _ in rows] + [len(axes.split(",")[0]), 4])
            label_w = min(label_w, 22)
            head = (f"  {'':<{label_w}} {base[:11]:>11} {arm[:11]:>11} {'change':>7} "
                    f"{'ratio':>6} {'95% CI':>13} verdict")
            lines += ["", f"  {axes}: {arm} vs {base}"[:WIDTH], head[:WIDTH]]
            for shared, c in rows:
                ci = "-" if not math.isfinite(c.ci_low) else f"{c.ci_low:.3f}..{c.ci_high:.3f}"
                change = "-" if not math.isfinite(c.ratio) else f"{c.change:+.1%}"
                ratio = "-" if not math.isfinite(c.ratio) else f"{c.ratio:.3f}"
                line = (f"  {(shared or '-')[:label_w]:<{label_w}} {_num(c.median_baseline):>11} "
                        f"{_num(c.median):>11} {change:>7} {ratio:>6} {ci:>13} {c.verdict}")
                lines.append(line[:WIDTH])
    return lines


def _wrap(text: str, indent: str = "  ") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")


def render(d: ReportData) -> str:
    p = d.plan.profile
    c = d.counts()
    env = d.environments[0] if d.environments else {}
    out = _wrap(f"[mmlab] {p.name}: {p.description or d.workload.summary}", "") + [""]
    out += ["What was run"]
    out += _wrap(f"workload {d.workload.name}: {d.workload.summary} "
                 f"(reproduces seed {d.workload.seed})")
    out += _wrap(f"arms ({len(d.plan.arms)}): " + "; ".join(a.name for a in d.plan.arms))
    out += _wrap(f"schedule: {p.repetitions} rounds, every arm once per round in an order "
                 f"shuffled by seed {p.seed}; {p.samples_per_trial} sample(s) per trial after "
                 f"{p.warmups if p.warmups is not None else 'the workload default'} warm-up(s)")
    first = d.row["profile_text"].splitlines()[0] if d.row["profile_text"] else ""
    if first.startswith("# "):
        out += _wrap(f"this run: {first[2:]}")
    kernels = {e["guest_kernel"]: e.get("guest_kernel_source", "?") for e in d.environments
               if "guest_kernel" in e}
    for name, source in kernels.items():
        out += _wrap(f"kernel {name}: {source}")
    out += _wrap(f"trials: {c['done']} done, {c['failed']} failed, "
                 f"{c['planned'] + c['running']} not run; profile {d.row['profile_path']} "
                 f"(sha256 {d.row['profile_hash'][:16]})")
    out += ["", "Environment"]
    if env:
        out += _wrap(f"host: Linux {env.get('kernel')}, {env.get('cpus')} x "
                     f"{env.get('cpu_model')}, governor {env.get('governor')}")
        out += _wrap(f"mmlab {env.get('mmlab_version')} (git {env.get('git_commit')})")
    if d.accelerators:
        accel = ", ".join(sorted(d.accelerators))
        note = " (emulated timings: comparable only with each other)" if "tcg" in accel else ""
        out += _wrap(f"guests in QEMU, accelerator {accel}{note}")
    out += ["", "Results"] + _wrap(
        f"ratio = arm / baseline of medians; 95% CI by bootstrap, p by Mann-Whitney U; "
        f"no change = CI inside +-{p.tolerance:.0%}")
    out += results(d)
    out += ["", "Same-state audit"]
    findings = {k: v for k, v in d.judgement.findings.items() if v}
    if not findings:
        out += _wrap("every compared pair ran in the same page state where the profile did "
                     "not ask for a difference (THP backing, swap, KSM, VMAs, kernel, errors)")
    for (arm, base), found in findings.items():
        out += _wrap(f"{arm} vs {base} is not comparable:")
        for f in dict.fromkeys(map(str, found)):
            out += _wrap(f"- {f}", "    ")
    out += attribution(d)
    if d.missing:
        out += ["", "Missing"]
        for m in d.missing:
            out += _wrap(f"- {m}")
    out += ["", "Reproduce"]
    out += [f"  make setup   # in an mmlab checkout (git {env.get('git_commit', '?')})",
            f"  .venv/bin/mmlab experiment run {d.row['profile_path']}",
            "  .venv/bin/mmlab compare <ID>",
            "  or without mmlab: gcc -O2 -o repro reproducer-<arm>.c && ./repro --samples 5",
            "  (the reproducer files are in the evidence bundle)"]
    tags = regzbot_lines(d)
    if tags:
        out += [""] + tags
    return "\n".join(line[:WIDTH] for line in out) + "\n"


def attribution(d: ReportData) -> list[str]:
    if not d.attributions:
        return []
    focus = d.plan.profile.focus
    out = ["", "Where the time went (attribution trials, separate from timing)"]
    if focus:
        out += _wrap(f"perf stacks through {focus} only (the phase the metrics measure)")
    found = explain.explain_experiment(d.plan, d.attributions, d.samples, focus, n=4)
    for ex in found.pairs:
        if ex.deltas:
            change = ex.cpu_ns_per_unit - ex.cpu_ns_per_unit_baseline
            tops = ", ".join(f"{x.function} {x.change:+.4g} ns" for x in ex.deltas)
            out += _wrap(f"{ex.arm} vs {ex.baseline}: CPU time per {ex.unit} "
                         f"{change:+.4g} ns; largest changes: {tops}")
    guests = {g.arm: g for g in found.guests}
    arms = {a.arm: a for a in found.arms}
    for arm in d.attributions:
        if arm in guests:
            rows = ", ".join(f"{fig} {fn} {fmt(v)}" for fig, fn, v, _ in guests[arm].rows[:6])
            out += _wrap(f"{arm} (in-guest trace): {rows}")
        callers = arms[arm].callers[:2] if arm in arms else []
        for caller, n, us in (x for x in callers if x[1] >= MIN_LOCK_SEEN):
            out += _wrap(f"{arm}: lock waits ~{fmt(us)} us in {caller} ({n} seen)")
    return out


def summary_rows(d: ReportData) -> list[dict]:
    """Per arm and metric: the statistics a summary table carries."""
    rows = []
    for arm, ss in d.samples.items():
        for metric in d.plan.profile.metrics:
            s = summarize([x.metrics.get(metric) for x in ss])
            rows.append({"arm": arm, "metric": metric, **s.as_dict()})
    return rows
