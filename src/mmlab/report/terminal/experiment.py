"""One experiment on the terminal: its plan, its samples and the page state
they ran in, the figures per arm, the verdicts with their reasons, and one
line for how a run went (`run`, `experiment plan|run`, `show`, `compare`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mmlab.attribution.guest import figures, skipped
from mmlab.experiment.plan import Plan, baseline_for
from mmlab.judge.audit import guest_thp_notes
from mmlab.judge.comparison import Comparison
from mmlab.judge.measurements import BARE_METAL, SIMULATED_BARE_METAL
from mmlab.judge.stats import summarize
from mmlab.report import auditnotes
from mmlab.report.fmt import (
    DASH,
    VERDICT_RICH,
    arrow,
    change,
    ci,
    contrast,
    count_legend,
    finite,
    matched_state,
    num,
    p_value,
    pct,
    ratio,
    value,
    verdict_label,
)
from mmlab.report.terminal import escaped
from mmlab.report.terminal.fit import Fitted
from mmlab.workloads import Workload
from mmlab.workloads.samples import Sample

if TYPE_CHECKING:
    from mmlab.judge.measurements import Measurements
    from mmlab.judge.verdicts import Judgement
    from mmlab.run.runner import RunResult
    from mmlab.store import Store, Trial


def experiments_table(rows) -> Fitted:
    table = Table(title="experiments")
    for col in ("ID", "name", "workload", "created", "trials", "done", "failed"):
        table.add_column(col)
    for r in rows:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"]))
        table.add_row(str(r["id"]), escaped(r["name"]), escaped(r["workload"]),
                      created, str(r["trials"]), str(r["done"]), str(r["failed"]))
    return Fitted(table)


def print_experiment(out: Console, store: Store, exp_id: int) -> None:
    """`mmlab show`: the experiment's profile, trials by status, the first
    environment, the order, and the per-arm figures, all as stored."""
    from mmlab.store import status_counts
    row, plan, trials = store.experiment(exp_id), store.plan(exp_id), store.trials(exp_id)
    out.print(f"[bold]experiment {exp_id}[/bold]: {escaped(row['name'])} "
              f"({escaped(row['workload'])}), "
              f"profile {escaped(row['profile_path'])} "
              f"sha256 {row['profile_hash'][:12]}, seed {row['seed']}")
    out.print("trials: " + ", ".join(f"{v} {k}" for k, v in status_counts(trials).items() if v))
    envs = store.environments(exp_id)
    if envs:
        e = envs[0]
        out.print(escape(f"environment: kernel {e['kernel']}, {e['cpus']} x {e['cpu_model']}, "
                         f"mmlab {e['mmlab_version']} ({e['git_commit']})"))
    order = " ".join(f"{t.position}:{t.arm}" for t in trials[:30])
    out.print(escaped(f"order: {order}{' ...' if len(trials) > 30 else ''}"))
    out.print(arm_summary_table(plan.workload, store.samples_by_arm(exp_id),
                                plan.profile.metrics))


def plan_table(plan: Plan) -> Fitted:
    """The arms a profile expands to, as they would run: where, with which
    settings and parameters, and against which baseline."""
    p = plan.profile
    rounds = f"{p.repetitions}" + (f" to {p.rounds_at_most}" if p.rounds_at_most > p.repetitions
                                   else "")
    table = Table(title=f"{escaped(p.name)}: {len(plan.arms)} arms x {rounds} rounds, "
                        f"{len(plan.order)} trials planned, seed {p.seed}")
    for col in ("arm", "target", "settings", "parameters", "baseline"):
        table.add_column(col)
    for arm in plan.arms:
        settings = arm.settings.model_dump(exclude_defaults=True)
        base = baseline_for(plan, arm)
        table.add_row(escaped(arm.name),
                      escaped(arm.target) + (f" ({arm.cpus} cpus)" if arm.cpus else ""),
                      escape(", ".join(f"{k}={v}" for k, v in settings.items()) or DASH),
                      escaped(" ".join(f"--{k} {v}" for k, v in arm.params.items())),
                      escaped(base.name) if base else "(baseline)")
    return Fitted(table)


def samples_table(workload: Workload, samples: list[Sample]) -> Fitted:
    """One row per metric: each sample, then the median and the CV."""
    names = [m.name for m in workload.metrics if any(m.name in s.metrics for s in samples)]
    table = Table(title=f"{workload.name}: {len(samples)} samples")
    table.add_column("metric")
    for i in range(len(samples)):
        table.add_column(str(i + 1), justify="right")
    table.add_column("median", justify="right", style="bold")
    table.add_column("CV", justify="right")
    for name in names:
        summary = summarize([s.metrics.get(name) for s in samples])
        table.add_row(f"{name} {arrow(workload.metric(name))}",
                      *(num(s.metrics.get(name)) for s in samples), num(summary.median),
                      pct(summary.cv))
    return Fitted(table)


def state_table(samples: list[Sample]) -> Fitted:
    """The page state the samples ran in; differing values are all listed."""
    table = Table(title="page state (measured)", show_header=True)
    table.add_column("state")
    table.add_column("value(s)")
    for key in samples[0].state:
        values = []
        for s in samples:
            text = value(s.state.get(key))
            if text not in values:
                values.append(text)
        table.add_row(key, escape(", ".join(values)), style="yellow" if len(values) > 1 else None)
    return Fitted(table)


def vmstat_table(samples: list[Sample]) -> Fitted | str:
    """The counters' median deltas and the errors; where the samples hold
    neither (a workload that reads no counter this kernel has), a line
    that says so rather than an empty table."""
    table = Table(title="/proc/vmstat deltas per sample (median) and errors")
    table.add_column("counter")
    table.add_column("median", justify="right")
    for key in samples[0].vmstat_delta:
        table.add_row(key, num(summarize([s.vmstat_delta.get(key, 0) for s in samples]).median))
    errors: dict[str, float] = {}
    for s in samples:
        for k, v in s.errors.items():
            errors[k] = errors.get(k, 0) + v
    for k, v in errors.items():
        table.add_row(f"[red]error {k}[/red]", num(v))
    return Fitted(table) if table.rows else "/proc/vmstat: no counter recorded, and no errors"


def trace_table(traced: dict[str, float]) -> Fitted:
    """In-guest trace figures for the whole traced trial (warm-ups included)."""
    table = Table(title="in-guest trace (whole trial, instrumented: not for timing)")
    table.add_column("figure")
    table.add_column("function")
    table.add_column("value", justify="right")
    for f in figures(traced):
        table.add_row(f.figure, f.function, num(f.value))
    if skipped(traced):
        table.add_row("skipped", ", ".join(skipped(traced)), "")
    return Fitted(table)


def print_samples(out: Console, workload: Workload, samples: list[Sample]) -> None:
    """`mmlab run`: each sample's metrics, the page state they ran in, the
    vmstat deltas, in-guest trace counts, and where they ran."""
    out.print(samples_table(workload, samples))
    out.print(state_table(samples))
    out.print(vmstat_table(samples))
    traced = {k: v for k, v in samples[0].counts.items() if k.startswith("trace_")}
    if traced:
        out.print(trace_table(traced))
    for line in accelerator_notes({"run": samples}):
        out.print(line)


def arm_summary_table(workload: Workload, samples: dict[str, list[Sample]],
                      metrics: list[str]) -> Fitted:
    table = Table(title="per arm: median (CV), n")
    table.add_column("arm")
    table.add_column("n", justify="right")
    for m in metrics:
        table.add_column(f"{m} {arrow(workload.metric(m))}", justify="right")
    for arm, ss in samples.items():
        cells = []
        for m in metrics:
            s = summarize([x.metrics.get(m) for x in ss])
            cells.append(f"{num(s.median)} ({pct(s.cv)})")
        table.add_row(escaped(arm), str(len(ss)), *cells)
    return Fitted(table)


def accelerator_notes(samples: dict[str, list[Sample]]) -> list[str]:
    """Say plainly which arms ran emulated, once per accelerator."""
    by_accel: dict[str, list[str]] = {}
    for arm, ss in samples.items():
        for accel in {str(s.state.get("accelerator", "none (host)")) for s in ss}:
            by_accel.setdefault(accel, []).append(arm)
    notes = []
    for accel, arms in by_accel.items():
        if accel == "tcg":
            notes.append(f"[yellow]accelerator: TCG for {len(arms)} arm(s): timings are emulated "
                         "and comparable only with other TCG timings[/yellow]")
        elif accel == "kvm":
            notes.append(f"accelerator: KVM for {len(arms)} arm(s)")
        elif accel == SIMULATED_BARE_METAL:
            notes.append(f"[yellow]accelerator: {escape(accel)} for {len(arms)} arm(s): kexec'd "
                         "on a TCG guest standing in for a machine, so timings are emulated "
                         "and comparable only with each other[/yellow]")
        elif accel == BARE_METAL:
            notes.append(f"accelerator: {accel} for {len(arms)} arm(s): kexec'd on the machine")
    return notes


def compare_table(plan: Plan, title: str, judged: Judgement) -> Fitted:
    """Mailing-list layout: medians side by side, the change, the ratio and its
    CI (at the level of the look that decided), p raw and corrected for the
    family, and the rounds the verdict rests on; a noisy pair and emulated
    time (a TCG guest's clock) are marked."""
    table = Table(title=escaped(title))
    table.add_column("metric")
    table.add_column("arm vs baseline")
    for col in ("baseline", "arm", "change", "ratio", "CI", "p", "p adj.", "rounds"):
        table.add_column(col, justify="right")
    table.add_column("verdict")
    for c in judged.comparisons:
        table.add_row(c.metric, escape(contrast(plan, c.arm, c.baseline).label),
                      num(c.median_baseline), num(c.median), change(c.ratio), ratio(c.ratio, "x"),
                      ci(c.ci_low, c.ci_high), p_value(c.p_value), p_value(c.p_adjusted),
                      str(c.rounds or DASH),
                      f"[{VERDICT_RICH[c.verdict]}]"
                      f"{verdict_label(c, judged.emulated_time(plan, c))}[/]"
                      + (" (noisy)" if c.noisy else ""))
    return Fitted(table, key=2)


def reasons(comparisons: list[Comparison],
            matched: dict[tuple[str, str, str], list[tuple[str, Comparison]]] | None = None
            ) -> list[str]:
    """Per comparison: why its verdict, how it was reached (method, CI level,
    correction, rounds and why they stopped), the outlier trials it kept, the
    order effects found in the run, and for a pair in different page states
    its matched-state controls."""
    out = []
    for c in comparisons:
        level = "" if not finite(c.confidence) or f"{c.confidence:.1%} CI" in c.reason \
            else f"{c.confidence:.1%} CI"
        how = ", ".join(x for x in (c.method, level, c.correction, c.stopped) if x)
        out.append(f"{c.metric} {c.arm} vs {c.baseline}: {c.verdict}: {c.reason}"
                   + (f" [{how}]" if how else ""))
        if c.outliers:
            out.append("  outliers (kept): " + "; ".join(map(str, c.outliers)))
        if c.beside:
            out.append("  not the trials' own (a neighbour's): " + c.beside)
        if c.order_effects:
            out.append("  order effects found (balanced by the schedule): "
                       + "; ".join(map(str, c.order_effects)))
        for label, ctrl in (matched or {}).get((c.metric, c.arm, c.baseline), []):
            out.append("  different page state; " + matched_state(label, ctrl))
    return out


def print_verdicts(out: Console, exp_id: int, plan: Plan, measured: Measurements,
                   judged: Judgement) -> None:
    """The per-arm figures, which arms ran emulated, the verdicts with
    their reasons, and the audit's findings no verdict carries
    (auditnotes): what `experiment run` and `compare` print."""
    samples = measured.by_arm
    out.print(arm_summary_table(plan.workload, samples, plan.profile.metrics))
    for line in accelerator_notes(samples):
        out.print(line)
    for line in count_legend(plan.workload, plan.profile.metrics, samples):
        out.print(escape(line))
    for line in guest_thp_notes(samples):
        out.print(escape(line))
    if judged.comparisons:
        out.print(compare_table(plan, f"experiment {exp_id}: {plan.profile.name}", judged))
    else:
        out.print(escaped(f"experiment {exp_id}: {plan.profile.name}: no pair of arms to "
                          "compare"))
    for line in reasons(judged.comparisons, judged.matched):
        out.print(escaped(line))
    notes = [line for said in auditnotes.noted(judged, plan.profile.metrics).values()
             for line in said]          # each names its arms
    if notes:
        out.print("same-state audit, noted (no verdict above rests on it):")
    for line in notes:
        out.print(escaped(f"- {line}"))


def run_line(result: RunResult, prefix: str = "") -> str:
    """What a run did, in one line: trials run now, already done and failed,
    the rounds (and how many were added) and why rounds stopped."""
    return escaped(f"{prefix}trials: {result.done} run now, {result.skipped} already "
                            f"done, {result.failed} failed; {result.rounds} rounds "
                            f"({result.added} added): {result.stopped}")


def failed_lines(trials: list[Trial], most: int = 5) -> list[str]:
    """The first failed trials with their errors, one line each."""
    return [f"[red]failed[/red] trial {t.position} ({escaped(t.arm)}): "
            f"{escaped(t.error or '')}" for t in trials[:most]]
