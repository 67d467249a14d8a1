"""Plain text: an experiment's report for a mailing list (prose wrapped
at 80 columns and never cut, commands whole, no colour), and the tracker's
summary of what changed, in the style of a 0-day report (`track run`, the
dashboard's summary.txt).

Per metric, comparisons that contrast the same two values (debian:6.1 vs
debian:6.12) form one table with a row per value of the other axes, the
layout such reports use:

    cpus   debian:6.1  debian:6.12   change   ratio  CI            verdict
"""

from __future__ import annotations

import re
import shlex
import textwrap
from collections import defaultdict

from mmlab.judge import measurements
from mmlab.judge.audit import guest_thp_notes
from mmlab.judge.comparison import Comparison
from mmlab.judge.stats import summarize
from mmlab.report import auditnotes, fmt
from mmlab.report.data import ReportData, regzbot_lines
from mmlab.track import dashboard
from mmlab.track.changepoints import EMULATED, Change
from mmlab.track.evidence import Evidence
from mmlab.track.session import TrackResult
from mmlab.track.suite import Suite

WIDTH = 80
MIN_LOCK_SEEN = 10      # fewer contentions than this are background, not the workload
TEXT_TOP = 4            # functions named per pair
FIGURES_W = 54          # result columns between a row's label and its verdict
VALUE_W = 11            # a median's column, headed by its axis value where that fits
EMULATED_MARK = "*"     # after a verdict whose figures are emulated time


def results(d: ReportData) -> list[str]:
    """Per metric, a table per contrast (the axis values two arms differ in,
    from the plan) with a row per value of the other axes; a row of
    emulated time is marked beside its verdict and the mark explained."""
    lines = []
    for metric in d.plan.profile.metrics:
        m = d.workload.metric(metric)
        lines += [""] + _wrap(f"{metric} [{fmt.statistic(m)}] ({m.unit}, {m.direction} is "
                              "better), medians of trials:", "")
        groups: dict[tuple, list[tuple[fmt.Contrast, Comparison]]] = defaultdict(list)
        for c in d.judgement.comparisons:
            if c.metric == metric:
                k = fmt.contrast(d.plan, c.arm, c.baseline)
                groups[(k.axes, k.baseline, k.arm)].append((k, c))
        for (axes, base, arm), rows in groups.items():
            lines += [""] + _wrap(f"{axes}: {arm} vs {base}") + _table(base, arm, rows, d)
    return lines


def _table(base: str, arm: str, rows: list[tuple[fmt.Contrast, Comparison]],
           d: ReportData) -> list[str]:
    """A row per value of the other axes, headed by the axis when it is one.
    A label too long to leave the verdict its room gets a line of its own;
    axis values too long to head their columns are named by the line above
    the table, which the columns then call baseline and arm."""
    axes = {tuple(k for k, _ in x.shared) for x, _ in rows}
    one = len(axes) == 1 and len(next(iter(axes))) == 1
    head = next(iter(axes))[0] if one else ""
    labels = [(x.shared[0][1] if one else x.others) or fmt.DASH for x, _ in rows]
    verdicts = [f"{c.verdict}{EMULATED_MARK if d.emulated(c) else ''}" for _, c in rows]
    room = WIDTH - 2 - FIGURES_W - max(map(len, verdicts))
    label_w = max(min(max(len(x) for x in labels), room), len(head))
    base, arm = (base, arm) if max(len(base), len(arm)) <= VALUE_W else ("baseline", "arm")
    out = [f"  {head:<{label_w}} {base:>11} {arm:>11} {'change':>7} {'ratio':>6} {'CI':>13} "
           "verdict"]
    for label, (_, c), verdict in zip(labels, rows, verdicts):
        if len(label) > label_w:
            out += _wrap(label)
            label = ""
        out.append(f"  {label:<{label_w}} {fmt.num(c.median_baseline):>11} "
                   f"{fmt.num(c.median):>11} {fmt.change(c.ratio):>7} "
                   f"{fmt.ratio(c.ratio):>6} {fmt.ci(c.ci_low, c.ci_high):>13} {verdict}")
    if any(v.endswith(EMULATED_MARK) for v in verdicts):
        out.append(f"  {EMULATED_MARK} emulated time: measured in a TCG guest")
    return out


def details(d: ReportData) -> list[str]:
    """How each verdict was reached: method, rounds, corrected p, why the rounds
    stopped, a noisy pair, the outlier trials kept and the order effects found."""
    out = ["", "  how each verdict was reached:"]
    for c in d.judgement.comparisons:
        p_adj = "" if not fmt.finite(c.p_adjusted) or not c.correction else \
            f", p {fmt.p_value(c.p_value)} ({c.correction}: {fmt.p_value(c.p_adjusted)})"
        level = "" if not fmt.finite(c.confidence) or not c.method else f", {c.confidence:.1%} CI"
        out += _wrap(f"- {c.metric}, {c.arm} vs {c.baseline}: {c.verdict}, "
                     f"{c.method or 'no estimate'}{level}{p_adj}; {c.stopped or '-'}"
                     + (f"; noisy ({c.noisy})" if c.noisy else ""))
        if c.outliers:
            out += _wrap("outliers kept: " + "; ".join(map(str, c.outliers)), "      ")
        if c.beside:
            out += _wrap("not the trials' own (a neighbour's): " + c.beside, "      ")
        if c.order_effects:
            out += _wrap("order effects found (balanced by the schedule): "
                         + "; ".join(map(str, c.order_effects)), "      ")
    return out


def _wrap(text: str, indent: str = "  ") -> list[str]:
    """Prose at WIDTH columns, broken only between words: a name, a path or
    an arm label is never split (one longer than a line has a line of its own)."""
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_long_words=False, break_on_hyphens=False)


def command(words: list[str], indent: str = "  ") -> list[str]:
    """A shell command as it can be pasted: its words quoted where the shell
    needs it (not `&&`, nor a word with a <placeholder> to fill in), on one
    line where it fits, else on continuation lines ending in a backslash; a
    word is never split."""
    out = [indent]
    for word in (w if w == "&&" or re.search(r"<\w+>", w) else shlex.quote(w) for w in words):
        if out[-1].strip() and len(out[-1]) + 1 + len(word) + 2 > WIDTH:
            out[-1] += " \\"
            out.append(indent + "    ")
        out[-1] += (" " if out[-1].strip() else "") + word
    return out


def render(d: ReportData) -> str:
    p = d.plan.profile
    c = d.counts()
    env = d.environments[0] if d.environments else {}
    out = _wrap(f"[mmlab] {p.name}: {p.description or fmt.summary(d.plan)}", "") + [""]
    out += ["What was run"]
    out += _wrap(f"workload {d.workload.name}: {fmt.summary(d.plan)}"
                 + (f" (reproduces seed {d.workload.seed})" if d.workload.seed else ""))
    out += _wrap(f"arms ({len(d.plan.arms)}): " + "; ".join(a.name for a in d.plan.arms))
    budget = f", within {p.budget_s:g} s" if p.budget_s else ""
    rounds = (f"{p.repetitions} rounds" if p.rounds_at_most == p.repetitions else
              f"{p.repetitions} to {p.rounds_at_most} rounds (more while verdicts are undecided"
              f"{budget}; {d.judgement.rounds} run)")
    out += _wrap(f"schedule: {rounds}, every arm once per round in an order "
                 f"shuffled by seed {p.seed}; {p.samples_per_trial} sample(s) per trial after "
                 f"{p.warmups if p.warmups is not None else 'the workload default'} warm-up(s)")
    if p.derived:
        out += _wrap(f"this run: {p.derived}")
    kernels = {e[f"{k}_kernel"]: e.get(f"{k}_kernel_source", "?") for e in d.environments
               for k in ("guest", "kexec") if f"{k}_kernel" in e}
    for name, source in kernels.items():
        out += _wrap(f"kernel {name}: {source}")
    out += _wrap(f"trials: {c['done']} done, {c['failed']} failed, "
                 f"{c['planned'] + c['running']} not run; profile {d.row['profile_path']} "
                 f"(sha256 {d.row['profile_hash'][:16]})")
    out += ["", "Environment"]
    if env:
        turbo = f", turbo {env['turbo']}" if "turbo" in env else ""   # older trials lack it
        out += _wrap(f"host: Linux {env.get('kernel')}, {env.get('cpus')} x "
                     f"{env.get('cpu_model')}, governor {env.get('governor')}{turbo}")
        out += _wrap(f"mmlab {env.get('mmlab_version')} (git {env.get('git_commit')})")
    guests = d.accelerators & {"kvm", "tcg"}
    if guests:
        accel = ", ".join(sorted(guests))
        note = " (emulated timings: comparable only with each other)" if "tcg" in accel else ""
        out += _wrap(f"guests in QEMU, accelerator {accel}{note}")
    for machine in sorted(d.accelerators - guests):
        note = " (emulated timings: comparable only with each other)" \
            if machine in measurements.EMULATED else ""
        out += _wrap(f"kernels kexec'd on the machine: {machine}{note}")
    out += ["", "Results"] + _wrap(
        f"ratio = typical arm / baseline ratio of a round (Hodges-Lehmann), CI from the "
        f"Wilcoxon signed-rank distribution, p by signed-rank test (unpaired: ratio of medians, "
        f"bootstrap CI, Mann-Whitney U); no change = CI inside +-{p.tolerance:.0%}; regression "
        f"or improvement = p "
        + ("(Holm-corrected over the comparisons judged together) " if p.correction == "holm"
           else "(uncorrected) ")
        + f"below alpha and the ratio beyond +-{p.tolerance:.0%}; "
        f"{d.judgement.criteria.describe()}")
    used = dict.fromkeys(fmt.statistic(d.workload.metric(m)) for m in p.metrics)
    out += _wrap("each figure is the median over trials of the statistic named beside "
                 "its metric: " + "; ".join(f"[{s}] {fmt.STATISTICS[s]}" for s in used))
    for line in fmt.count_legend(d.workload, p.metrics, d.samples):
        out += _wrap(line)
    out += results(d)
    out += details(d)
    out += ["", "Same-state audit"]
    for note in guest_thp_notes(d.samples):
        out += _wrap(note)
    findings = {k: v for k, v in d.judgement.findings.items() if v}
    binding = {k: [f for f in v if any(f.matters_for(m) for m in p.metrics)]
               for k, v in findings.items()}
    if not d.judgement.findings:
        out += _wrap("no pair of arms to compare; each arm's own trials are audited")
    elif not any(binding.values()):
        out += _wrap("every compared pair ran in the same page state where the profile did "
                     "not ask for a difference (THP backing, swap, KSM, VMAs, kernel, errors)")
    for (arm, base), found in findings.items():
        if binding[arm, base]:
            out += _wrap(f"{arm} vs {base} is not comparable (its ratios above compare "
                         "different page states):")
        for f in dict.fromkeys(map(str, binding[arm, base])):
            out += _wrap(f"- {f}", "    ")
        noted = [f for f in found if f not in binding[arm, base]]
        if noted:
            out += _wrap(f"{arm} vs {base}, noted (no verdict above rests on it):")
        for f in dict.fromkeys(map(str, noted)):
            out += _wrap(f"- {f}", "    ")
        for (metric, a, b), controls in d.judgement.matched.items():
            if (a, b) == (arm, base):
                for label, ctrl in controls:
                    out += _wrap(f"- {metric}: {fmt.matched_state(label, ctrl)}", "    ")
    for heading, said in auditnotes.noted(d.judgement, p.metrics, pairs=False).items():
        out += _wrap(f"{heading}, noted (in no pair: no verdict rests on it):")
        for line in said:
            out += _wrap(f"- {line}", "    ")
    out += attribution(d)
    if d.missing:
        out += ["", "Missing"]
        for m in d.missing:
            out += _wrap(f"- {m}")
    out += ["", "Reproduce"] + reproduce(d, env)
    tags = regzbot_lines(d)
    if tags:
        out += [""] + tags
    return fmt.printable("\n".join(out) + "\n", keep="\n")


def reproduce(d: ReportData, env: dict) -> list[str]:
    """The commands that run the experiment again, each whole (`command`),
    and how to check it without mmlab."""
    out = _wrap(f"# in an mmlab checkout (git {env.get('git_commit', '?')}):")
    out += command(["make", "setup"])
    out += command([".venv/bin/mmlab", "experiment", "run", d.row["profile_path"]])
    out += command([".venv/bin/mmlab", "compare", "<ID>"])
    if d.workload.kind == "exec":
        return out + _wrap("# or without mmlab: each arm's command in the evidence bundle's "
                           "commands.txt")
    out += _wrap("# or without mmlab, with a reproducer file from the evidence bundle:")
    return out + command(["gcc", "-O2", "-o", "repro", "reproducer-<arm>.c", "&&", "./repro",
                          "--samples", "5"])


def attribution(d: ReportData) -> list[str]:
    found = d.explanation
    if not found:
        return []
    out = ["", "Where the time went (attribution trials, separate from timing)"]
    if found.focus:
        out += _wrap(f"perf stacks through {found.focus} only (the phase the metrics measure)")
    for ex in found.pairs:
        if ex.deltas:
            tops = ", ".join(f"{x.function} {fmt.signed(x.change)} ns"
                             for x in ex.deltas[:TEXT_TOP])
            out += _wrap(f"{ex.arm} vs {ex.baseline}: CPU time per {ex.unit} "
                         f"{fmt.signed(ex.cpu_change)} ns; largest changes: {tops}")
    if found.functions:
        out += _wrap(fmt.FUNCTIONS_LEGEND)
    for w in found.functions:
        tops = ", ".join(f"{r.label} {fmt.signed(r.change)}" if w.baseline else
                         f"{r.label} {fmt.num(r.per_unit)}" for r in w.rows[:TEXT_TOP])
        if w.baseline:
            out += _wrap(f"{w.arm} vs {w.baseline}: kernel instructions per {w.unit} in "
                         f"{w.window} {fmt.num(w.kernel_baseline)} -> {fmt.num(w.kernel)}; "
                         f"largest changes: {tops}")
        else:
            out += _wrap(f"{w.arm}: kernel instructions per {w.unit} in {w.window} "
                         f"{fmt.num(w.kernel)}; largest: {tops}")
        if said := fmt.beside_trials(w):
            out += _wrap(said, "    ")
        for p in w.paths:
            out += _wrap(fmt.call_path(p, w.unit), "    ")
    guests = {g.arm: g for g in found.guests}
    arms = {a.arm: a for a in found.arms}
    for arm in d.attributions:
        if arm in guests:
            rows = ", ".join(f"{f.figure} {f.function} {fmt.num(f.value)}"
                             for f in guests[arm].figures[:6])
            out += _wrap(f"{arm} (in-guest trace): {rows}")
        callers = arms[arm].callers[:2] if arm in arms else []
        for c in (c for c in callers if c.seen >= MIN_LOCK_SEEN):
            out += _wrap(f"{arm}: lock waits ~{fmt.num(c.wait_us)} us in {c.caller} "
                         f"({c.seen} seen)")
    return out


def summary_rows(d: ReportData) -> list[dict]:
    """Per arm and metric: the statistics a summary table carries."""
    rows = []
    for arm, ss in d.samples.items():
        for metric in d.plan.profile.metrics:
            s = summarize([x.metrics.get(metric) for x in ss])
            rows.append({"arm": arm, "metric": metric, **s.as_dict()})
    return rows


def _spread(value: float, rcv: float) -> str:
    return f"{fmt.num(value)} ±{fmt.spread(rcv)}"


def pair_lines(group: list[Evidence]) -> list[str]:
    """One release pair as a 0-day report gives it: each change's headline,
    the two releases, each metric on both with its spread and the change
    (and why the tracker's outcome is not the verdict, where it is not),
    side metrics, functions, and the commands."""
    e = group[0]
    ch = e.change
    out = [f"[{g.change.id}] {ch.profile}: {_pct(g)} {g.change.outcome} of {g.change.metric}"
           f"{_emulated(g.change)}" for g in group]
    confirmed = {g.change.evidence: g for g in group if g.rounds}
    out += [f"  between {e.before} and {e.after} (series {ch.kind}"
            + "".join(f", {g.measured} in {g.rounds} rounds" for g in
                      confirmed.values())
            + (f", confirmed {e.confirmed_at})" if confirmed else ")"), ""]
    if e.metrics:
        w = max(16, *(len(_spread(m.after, m.spread_after)) for m in e.metrics))
        out.append(f"  {e.before.split()[0]:>{w}}  {'':>8}  {e.after.split()[0]:>{w}}")
        out.append(f"  {'-' * w}  {'-' * 8}  {'-' * w}")
        for m in e.metrics:
            out.append(f"  {_spread(m.before, m.spread_before):>{w}}  {fmt.change(m.ratio):>8}  "
                       f"{_spread(m.after, m.spread_after):>{w}}  {m.metric}"
                       f"{', emulated' if m.emulated else ''} "
                       f"({fmt.ci(*m.ci)}, {m.outcome})")
        for m in e.metrics:
            if m.why:
                out += _wrap(f"{m.metric}: {m.outcome}, where the verdict says {m.verdict}: "
                             f"{m.why}")
        out.append("")
    for v in e.vmstat:
        out.append(f"  vmstat {v.counter}: {fmt.num(v.per_unit_baseline)} -> "
                   f"{fmt.num(v.per_unit)} per unit")
    for s in e.state:
        if fmt.value(s.before) != fmt.value(s.after):
            out.append(f"  page state {s.key}: {fmt.value(s.before)} -> {fmt.value(s.after)}")
    out += [f"  audit: {f}" for f in e.findings]
    for wf in e.functions:
        rows = ", ".join(f"{r.label} {fmt.signed(r.change)}" for r in wf.rows[:5]) or \
            "no change"
        out.append(f"  functions ({wf.window}, kernel instructions per {wf.unit}): {rows}")
        out += [f"    {fmt.call_path(p, wf.unit, 4)}" for p in wf.paths
                if p.per_unit != p.per_unit_baseline]
    out += [f"  {name}: {cmd}" for name, cmd in e.commands.items()]
    return out + [""]


def release_note(suite: Suite, release: str, areas: dict[str, list[Evidence]]) -> str:
    """One release's page: what it changed in mm performance, by mm area,
    each change with its size, the series it was found in and the kernel
    functions that moved."""
    lines = [f"What {release} changed in mm performance (mmlab track {suite.name}, "
             f"confirmed changes only)", ""]
    for area, found in sorted(areas.items()):
        lines += [f"{area}:"]
        for e in found:
            ch = e.change
            lines += _wrap(f"- [{ch.id}] {ch.profile}: {_pct(e)} {ch.outcome} of {ch.metric}, "
                           f"{ch.before} -> {ch.after} (series {ch.kind})")
            for wf in e.functions:
                rows = ", ".join(f"{r.label} {fmt.signed(r.change)}" for r in wf.rows[:5])
                lines += _wrap(f"functions ({wf.window}, kernel instructions per {wf.unit}): "
                               f"{rows or 'no change'}", "    ")
        lines.append("")
    return fmt.printable("\n".join(lines).rstrip() + "\n", keep="\n")


def _pct(e: Evidence) -> str:
    """A change's size as the dashboard and its trend plot give it (fmt.step)."""
    c = e.change.confirmation
    said = fmt.change(fmt.step(e.change))
    return said if c is not None and fmt.finite(c.ratio) else f"{said} (cells)"


def _emulated(ch: Change) -> str:
    """Said after a change of emulated figures whose outcome does not say so."""
    return " (emulated time)" if ch.emulated and ch.outcome not in EMULATED else ""


def tally_line(changes: list[Change]) -> str:
    """How many changes end in each outcome, emulated time apart."""
    found = dashboard.tally(changes)
    return "; ".join(f"{n} {outcome}" for outcome, n in found.items()) or "none"


EMULATED_NOTE = ("emulated time: steps of time measured in a TCG guest, where time can "
                 "move the other way from hardware time; never a regression or an "
                 "improvement on their own (emulated time only: the pair's instruction "
                 "counts did not change; emulated time, not counted: nothing counted them)")


def track_summary(suite: Suite, result: TrackResult, evidence: list[Evidence],
                  only_new: bool = False) -> str:
    """What changed, in the style of a 0-day report: every confirmed change
    or state change (with `only_new`, those whose confirmation ran now),
    one entry per release pair; then the emulated time steps apart; then
    the other candidates in a line each."""
    ref = result.reference
    now = (f"{result.cells} cell(s) in {len(result.measured)} experiment(s) and "
           f"{len(result.confirmations)} confirmation(s) measured now; " if only_new else "")
    releases = len({p.release for s in result.series for p in s.points})
    lines = [f"mmlab track {suite.name}: {now}{len(result.series)} series over {releases} "
             f"releases, against {ref.name} ({ref.version})",
             f"changes: {tally_line(result.changes)}", ""]
    shown = [e for e in evidence if e.change.outcome in dashboard.SHOWN
             and (not only_new or e.change.evidence in result.confirmations)]
    confirmed = [e for e in shown if not dashboard.emulated(e)]
    for group in dashboard.groups(confirmed):
        lines += pair_lines(group)
    if not confirmed:
        lines += ["no new confirmed change" if only_new else "no confirmed change", ""]
    apart = dashboard.groups([e for e in shown if dashboard.emulated(e)])
    if apart:
        lines += _wrap(EMULATED_NOTE, "") + [""]
    for group in apart:
        lines += pair_lines(group)
    notes = dashboard.release_notes(suite, evidence)
    if notes and not only_new:
        lines.append("what each release changed in mm performance (releases/RELEASE.txt):")
        lines += [f"  {release}: " + ", ".join(f"{area} ({len(found)})"
                                               for area, found in sorted(areas.items()))
                  for release, areas in notes]
        lines.append("")
    for e in dashboard.newest_first(evidence):
        if e.change.outcome not in dashboard.SHOWN:
            ch = e.change
            lines.append(f"candidate {ch.id} {ch.profile} {ch.metric} ({ch.kind}) "
                         f"{ch.before}..{ch.after}: {ch.outcome}{_emulated(ch)}")
    return fmt.printable("\n".join(lines).rstrip() + "\n", keep="\n")
