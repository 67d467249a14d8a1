"""The `mmlab` command: parses arguments and calls the modules that do the work."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import signal
import sys
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from mmlab import experiment, kernels, workloads
from mmlab.attribution.guest import Instrumentation
from mmlab.errors import Interrupted, MmlabError
from mmlab.judge import selftest, verdicts
from mmlab.kernels import qemu_plugin
from mmlab.machine import knobs, probe
from mmlab.machine.knobs import HostSettings
from mmlab.report import terminal
from mmlab.run import runner
from mmlab.store import Store, status_counts
from mmlab.targets import TargetPool, qemu
from mmlab.workloads import execwork, mmwork

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="markdown",
                  help="Reproduce, measure and explain Linux mm performance reports.")
experiment_app = typer.Typer(no_args_is_help=True, help="Run profiles: interleaved, resumable.")
app.add_typer(experiment_app, name="experiment")
kernels_app = typer.Typer(no_args_is_help=True, help="Kernel images for QEMU guests.")
app.add_typer(kernels_app, name="kernels")
selftest_app = typer.Typer(no_args_is_help=True, help="How well mmlab's own methods work.")
app.add_typer(selftest_app, name="selftest")

RESULTS = typer.Option("mmlab-results", "--results", parser=str,
                       help="lab directory holding the store, or a fleet's shared store: "
                            "postgresql://user@host/db")
ALLOW = typer.Option(False, "--allow-host-changes",
                     help="let arms and workloads change global settings (restored afterwards)")


@app.callback()
def _startup() -> None:
    """Before any command: undo what a crashed mmlab left changed."""
    try:
        restored = knobs.replay_orphaned()
    except MmlabError as exc:
        typer.echo(f"mmlab: warning: {exc}", err=True)
        return
    if restored:
        typer.echo("mmlab: an earlier run did not finish; restored: " + "; ".join(restored),
                   err=True)


@app.command("workloads")
def workloads_cmd(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """List the workloads: seed, parameters, metrics and mm paths."""
    table = workloads.registry()
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(w) for w in table.values()], indent=1))
        return
    terminal.console().print(terminal.workloads_table(list(table.values())))
    typer.echo("and exec: any command or C file as a workload (mmlab run exec -- CMD ARGS..., "
               "mmlab run --source repro.c; profiles with workload = \"exec\")")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(ctx: typer.Context,
        workload: str = typer.Argument(None, help="workload name (see `mmlab workloads`), or "
                                                  "exec followed by -- CMD ARGS..."),
        reps: int = typer.Option(5, "--reps", min=1, help="samples, one mmwork process each"),
        as_json: bool = typer.Option(False, "--json",
                                     help="print the samples as JSON lines and nothing else"),
        allow_host_changes: bool = typer.Option(
            False, "--allow-host-changes",
            help="let a workload change global settings (ksm-rmap drives KSM); "
                 "they are restored afterwards"),
        kernel: str = typer.Option("host", "--kernel",
                                   help="run in a QEMU guest: debian:6.12, local:NAME"),
        vcpus: int = typer.Option(1, "--vcpus", min=1, help="guest vCPUs"),
        memory_mb: int = typer.Option(1024, "--memory-mb", min=128, help="guest memory"),
        numa_nodes: int = typer.Option(1, "--numa-nodes", min=1,
                                       help="guest NUMA nodes (memory split evenly)"),
        trace_count: str = typer.Option("", "--trace-count",
                                        help="guest only: count calls of these functions (a,b)"),
        trace_time: str = typer.Option("", "--trace-time",
                                       help="guest only: time every call of these functions"),
        functions: int = typer.Option(0, "--functions", min=0,
                                      help="TCG guest only: then one more boot counting kernel "
                                           "instructions by function; print the top N per window"),
        source: Path = typer.Option(None, "--source", help="a C reproducer: compiled "
                                    "statically (cached) and run as `exec`; its arguments "
                                    "after --"),
        metrics_from: str = typer.Option(None, "--metrics-from",
                                         help="exec: stress-ng-yaml (with -Y {out}), "
                                              "key=value or json"),
        metric: list[str] = typer.Option([], "--metric", help="exec: NAME[=KEY]:higher|lower, "
                                         "a figure the command prints (repeatable)"),
        smaps: bool = typer.Option(False, "--smaps", help="exec: the command's smaps at its exit"),
        timeout_s: float = typer.Option(600, "--timeout-s", min=0.001,
                                        help="exec: kill the command after this long")
        ) -> None:
    """Run WORKLOAD on this kernel or, with --kernel, in a guest; workload
    parameters go as --name value.  `mmlab run exec -- CMD ARGS...` runs any
    command, `mmlab run --source repro.c [-- ARGS]` a C reproducer."""
    if workload == "exec" or source:
        args = ctx.args if workload in (None, "exec") else [workload, *ctx.args]
        try:
            wl: workloads.Workload = execwork.build(
                ["{source}", *args] if source else args, source=str(source) if source else None,
                metrics_from=metrics_from,
                declared=dict(map(execwork.parse_metric_option, metric)),
                smaps=smaps, timeout_s=timeout_s)
        except execwork.ProfileKeyError as exc:
            raise MmlabError(f"{exc.key}: {exc}") from exc
        params: dict = {}
    elif workload is None:
        raise MmlabError("mmlab run: name a workload (mmlab workloads), exec -- CMD, or "
                         "--source FILE")
    else:
        wl = workloads.get(workload)
        params = wl.parse_cli(ctx.args)
    wl.check(params)
    if kernel != "host":
        guest = qemu.Guest(kernels.get(kernel), vcpus=vcpus, memory_mb=memory_mb,
                           numa_nodes=numa_nodes)
        _run_guest(wl, params, reps, as_json, guest, trace_count, trace_time)
        if functions:
            _print_functions(wl, params, reps, guest, functions)
        return
    if trace_count or trace_time or functions:
        raise MmlabError("--trace-count/--trace-time/--functions need a guest kernel (--kernel): "
                         "the host has no kprobes, function_graph or TCG plugin (mmlab probe)")
    if wl.host_settings and not allow_host_changes:
        raise MmlabError(f"{wl.name} changes {', '.join(wl.host_settings)} while it runs; "
                         "pass --allow-host-changes (they are restored afterwards)")
    samples = []
    with _progress(disable=as_json) as progress:
        task = progress.add_task(f"{wl.name}", total=reps)
        for _ in range(reps):
            for sample in mmwork.run(wl, params, samples=1):
                samples.append(sample)
                if as_json:
                    typer.echo(sample.model_dump_json())
            progress.advance(task)
    _print_samples(wl, samples, as_json)


def _print_samples(wl: workloads.Workload, samples: list, as_json: bool) -> None:
    if as_json:
        return
    out = terminal.console()
    out.print(terminal.samples_table(wl, samples))
    out.print(terminal.state_table(samples))
    out.print(terminal.vmstat_table(samples))
    traced = {k: v for k, v in samples[0].counts.items() if k.startswith("trace_")}
    if traced:
        out.print(terminal.trace_table(traced))


def _run_guest(wl: workloads.Workload, params: dict, reps: int, as_json: bool, guest: qemu.Guest,
               trace_count: str, trace_time: str) -> None:
    """All repetitions in one boot of the guest kernel."""
    split = lambda text: tuple(f for f in text.split(",") if f)  # noqa: E731
    instrument = (Instrumentation(split(trace_count), split(trace_time))
                  if trace_count or trace_time else None)
    if not as_json:
        typer.echo(f"booting {guest.kernel.name} ({guest.kernel.version}) with {guest.vcpus} "
                   f"vCPU(s), {guest.memory_mb} MiB, {guest.numa_nodes} NUMA node(s)"
                   + (", traced" if instrument else ""), err=True)
    plugin, no_plugin = None, ""
    if params.get("insns"):      # --insns: counted in this very boot, timings included
        try:
            plugin = qemu_plugin.ensure()
        except MmlabError as exc:
            no_plugin = f"none (no QEMU plugin: {exc})"
            typer.echo(f"mmlab: instruction counts unavailable: {exc}", err=True)
    samples = qemu.run(guest, wl, params, reps, None, HostSettings(), instrument=instrument,
                       plugin=plugin)
    for s in samples if no_plugin else []:
        s.state["insns_source"] = no_plugin
    if as_json:
        for s in samples:
            typer.echo(s.model_dump_json())
    _print_samples(wl, samples, as_json)
    if not as_json:
        typer.echo(f"accelerator: {samples[0].state['accelerator']}"
                   + (" (emulated timings)" if samples[0].state["accelerator"] == "tcg" else ""))


def _print_functions(wl: workloads.Workload, params: dict, reps: int, guest: qemu.Guest,
                     top: int) -> None:
    """One TCG boot counting kernel instructions by function in the timed
    windows (attribution/functions.py), the top `top` per window printed."""
    from mmlab.attribution import explain as ex
    counted = qemu.count_functions(guest, wl, params, reps, None, HostSettings(),
                                   qemu_plugin.ensure())
    found = ex.explain_functions(guest.kernel.name, counted, n=top)
    if not found:
        raise MmlabError(f"--functions: no timed window of {wl.name} did any work here "
                         f"(windows: {', '.join(w.name for w in wl.windows) or 'none'})")
    out = terminal.console()
    for w in found:
        out.print(terminal.functions_table(w))


def _progress(disable: bool = False) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(),
                    TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn(),
                    console=terminal.console(), disable=disable or not sys.stdout.isatty(),
                    transient=True)


ATTRIBUTE = typer.Option(False, "--attribute",
                         help="after the timing trials, attribution trials (perf, lock tracing)")


def _run_plan(store: Store, exp_id: int, plan: experiment.Plan, lab: TargetPool,
              attribute: bool = False, with_controls: bool = True) -> None:
    out = terminal.console()
    with _progress() as progress:
        task = progress.add_task("starting", total=len(plan.order))
        lab.say = terminal.plain(progress.console)

        def on_trial(trial, index, total):
            progress.update(task, completed=index, total=total,
                            description=f"trial {index + 1}/{total} arm {trial.arm}")

        def on_look(judged):
            if judged.next_rounds:
                lab.say(f"after {judged.rounds} rounds {len(judged.undecided)} comparison(s) "
                        f"undecided: rounds added up to {judged.next_rounds}")
        result = runner.run(store, exp_id, plan, lab, on_trial, on_look, with_controls)
    lab.say = terminal.plain(out)
    plan = store.plan(exp_id)          # with the matched-state controls the run added
    out.print(f"trials: {result.done} run now, {result.skipped} already done, "
              f"{result.failed} failed; {result.rounds} rounds ({result.added} added): "
              f"{result.stopped}")
    if attribute or plan.profile.attribute:
        n = runner.attribute(store, exp_id, plan, lab, say=terminal.plain(out))
        out.print(f"attribution stored for {n} arm(s): mmlab explain {exp_id}")
    for t in store.trials(exp_id, status="failed")[:5]:
        out.print(f"[red]failed[/red] trial {t.position} ({terminal.escape(t.arm)}): "
                  f"{terminal.escape(t.error or '')}")
    _print_comparison(store, exp_id, plan)
    typer.echo(exp_id)


def _print_comparison(store: Store, exp_id: int, plan: experiment.Plan) -> None:
    out = terminal.console()
    measured = store.measurements(exp_id)
    samples = measured.by_arm
    out.print(terminal.arm_summary_table(plan.workload, samples, plan.profile.metrics))
    judged = verdicts.judge(plan, measured)
    for line in terminal.accelerator_notes(samples):
        out.print(line)
    out.print(terminal.compare_table(plan, f"experiment {exp_id}: {plan.profile.name}",
                                     judged.comparisons))
    for line in terminal.reasons(judged.comparisons, judged.matched):
        out.print(terminal.escape(line))


MAX_REPS = typer.Option(None, "--max-repetitions", min=3,
                        help="rounds at most (overrides the profile's max_repetitions)")
BUDGET = typer.Option(None, "--budget", min=0.001,
                      help="seconds of trials after which no rounds are added (budget_s)")
NO_CONTROLS = typer.Option(False, "--no-controls",
                           help="do not add matched-state control arms for pairs the audit "
                                "finds in different page states")


@experiment_app.command("plan")
def experiment_plan(profile: Path = typer.Argument(..., help="a TOML profile"),
                    max_repetitions: int = MAX_REPS, budget: float = BUDGET) -> None:
    """Expand PROFILE and show its arms, settings and schedule; runs nothing."""
    plan = experiment.with_limits(experiment.load(profile), max_repetitions, budget)
    terminal.console().print(terminal.plan_table(plan))
    for warning in plan.warnings():
        typer.echo(f"mmlab: warning: {warning}", err=True)


MACHINES = typer.Option(None, "--machines",
                        help="a,b,c: run on these fleet machines (their workers), one "
                             "experiment each, verdicts per machine; needs a postgresql:// store")


def _refuse_fleet_attribution(attribute: bool) -> None:
    if attribute:
        raise MmlabError("--attribute: attribution runs on one machine, not in fleet runs "
                         "(run the profile there with a lab directory)")


def _start_fleet(plan: experiment.Plan, results: str, machines: str, allow: bool,
                 attribute: bool, with_controls: bool) -> None:
    """Plan one experiment per machine in the shared store and run them."""
    from mmlab import fleet
    from mmlab.fleet import coordinator
    _refuse_fleet_attribution(attribute or plan.profile.attribute)
    for warning in plan.warnings():
        typer.echo(f"mmlab: warning: {warning}", err=True)
    store = Store(results)
    ids = coordinator.create(store, plan, fleet.machine_names(machines), allow)
    typer.echo(f"fleet {store.plan(ids[0]).fleet}: experiments "
               + ", ".join(f"{e} on {m}" for e, m in zip(ids, fleet.machine_names(machines)))
               + f"; store {store.where}", err=True)
    _run_fleet(results, ids, allow, with_controls)


def _run_fleet(results: str, ids: list[int], allow: bool, with_controls: bool) -> None:
    """Every machine's experiment at once, a progress bar each; then each
    machine's verdicts and where the change reproduced."""
    from mmlab.fleet import coordinator
    store = Store(results)
    plans = {e: store.plan(e) for e in ids}
    out = terminal.console()
    with _progress() as progress:
        say = terminal.plain(progress.console)
        bars = {p.machine: progress.add_task(p.machine, total=len(p.order))
                for p in plans.values()}

        def on_trial(machine, trial, index, total):
            progress.update(bars[machine], completed=index, total=total,
                            description=f"{machine}: trial {index + 1}/{total} arm {trial.arm}")

        def on_look(machine, judged):
            if judged.next_rounds:
                say(f"{machine}: after {judged.rounds} rounds {len(judged.undecided)} "
                    f"comparison(s) undecided: rounds added up to {judged.next_rounds}")
        ran = coordinator.run(results, ids, allow, on_trial, on_look, with_controls, say)
    for exp_id in ids:
        plan, result = store.plan(exp_id), ran[exp_id]
        out.print(terminal.escape(
            f"machine {plan.machine}, experiment {exp_id}: {result.done} run now, "
            f"{result.skipped} already done, {result.failed} failed; {result.rounds} rounds "
            f"({result.added} added): {result.stopped}"))
        for t in store.trials(exp_id, status="failed")[:5]:
            out.print(f"[red]failed[/red] trial {t.position} ({terminal.escape(t.arm)}): "
                      f"{terminal.escape(t.error or '')}")
        _print_comparison(store, exp_id, plan)
    _print_fleet(store, ids)
    typer.echo(ids[0])


def _print_fleet(store: Store, ids: list[int]) -> None:
    from mmlab.fleet import summary, tables
    found = summary.summarize(store, ids)
    out = terminal.console()
    for line in tables.machines_lines(found):
        out.print(line)
    out.print(tables.summary_table(found))


@experiment_app.command("run")
def experiment_run(profile: Path = typer.Argument(..., help="a TOML profile"),
                   results: Path = RESULTS, allow_host_changes: bool = ALLOW,
                   attribute: bool = ATTRIBUTE, max_repetitions: int = MAX_REPS,
                   budget: float = BUDGET, no_controls: bool = NO_CONTROLS,
                   machines: str = MACHINES) -> None:
    """Expand PROFILE, store its plan, run it; prints the experiment ID last.
    With --machines, one experiment per machine, run by the machines' workers."""
    plan = experiment.with_limits(experiment.load(profile), max_repetitions, budget)
    if machines:
        _start_fleet(plan, results, machines, allow_host_changes, attribute, not no_controls)
        return
    lab = TargetPool(allow_host_changes, say=terminal.plain(terminal.console()))
    lab.check(plan)
    for warning in plan.warnings():
        typer.echo(f"mmlab: warning: {warning}", err=True)
    store = Store(results)
    exp_id = store.create_experiment(plan)
    p = plan.profile
    rounds = (f"{p.repetitions}" if p.rounds_at_most == p.repetitions
              else f"{p.repetitions} to {p.rounds_at_most}")
    typer.echo(f"experiment {exp_id}: {len(plan.arms)} arms x {rounds} rounds, seed {p.seed}, "
               f"store {store.where}", err=True)
    _run_plan(store, exp_id, plan, lab, attribute, not no_controls)


@experiment_app.command("resume")
def experiment_resume(exp_id: int = typer.Argument(...), results: Path = RESULTS,
                      allow_host_changes: bool = ALLOW, attribute: bool = ATTRIBUTE,
                      max_repetitions: int = MAX_REPS, budget: float = BUDGET,
                      no_controls: bool = NO_CONTROLS) -> None:
    """Finish an interrupted experiment without repeating finished trials, and
    add rounds while its verdicts are undecided and its limits allow."""
    store = Store(results)
    plan = store.plan(exp_id)
    experiment.with_limits(plan, max_repetitions, budget)        # checked before stored
    if plan.machine:
        from mmlab.fleet import coordinator
        _refuse_fleet_attribution(attribute)
        ids = coordinator.members(store, exp_id)
        for member in ids:
            store.set_limits(member, max_repetitions, budget)
        _run_fleet(results, ids, allow_host_changes, not no_controls)
        return
    _run_plan(store, exp_id, store.set_limits(exp_id, max_repetitions, budget),
              TargetPool(allow_host_changes), attribute, not no_controls)


@app.command()
def explain(exp_id: int = typer.Argument(...), results: Path = RESULTS,
            as_json: bool = typer.Option(False, "--json", help="print JSON"),
            focus: str = typer.Option(None, "--focus",
                                      help="only stacks through this function, e.g. do_madvise "
                                           "for the pageout phase"),
            svg: Path = typer.Option(None, "--svg", help="write flame graphs (per arm and "
                                                         "differential) into this directory")
            ) -> None:
    """Where the time went per arm, and what carries each arm's difference
    from its baseline (needs an experiment run with --attribute)."""
    from mmlab.attribution import explain as ex
    store = Store(results)
    plan = store.plan(exp_id)
    focus = focus or plan.profile.focus
    attributed = ex.load(store.attributions(exp_id))
    if not attributed:
        raise MmlabError(f"experiment {exp_id} has no attribution: run it with --attribute "
                         f"(mmlab experiment resume {exp_id} --attribute adds it)")
    found = ex.explain_experiment(plan, attributed, store.samples_by_arm(exp_id), focus)
    if svg:
        from mmlab.report import flamegraph
        for path in flamegraph.write(svg, found):
            typer.echo(f"wrote {path}", err=True)
    if as_json:
        typer.echo(json.dumps(found.to_json(), indent=1))
        return
    out = terminal.console()
    if found.guests:
        out.print(terminal.guest_trace_table(found.guests))
    for w in found.functions:
        out.print(terminal.functions_table(w))
    for a in found.arms:
        out.print(terminal.arm_explanation(a))
    out.print(terminal.overhead_table(found.arms))
    for p in found.pairs:
        out.print(terminal.pair_explanation(plan, p))


@app.command("experiments")
def experiments_cmd(results: Path = RESULTS) -> None:
    """List the experiments in the store."""
    terminal.console().print(terminal.experiments_table(Store(results).experiments()))


@app.command()
def show(exp_id: int = typer.Argument(...), results: Path = RESULTS) -> None:
    """One experiment: its profile, environment, execution order and per-arm figures."""
    store = Store(results)
    row = store.experiment(exp_id)
    plan = store.plan(exp_id)
    out = terminal.console()
    out.print(f"[bold]experiment {exp_id}[/bold]: {row['name']} ({row['workload']}), "
              f"profile {row['profile_path']} sha256 {row['profile_hash'][:12]}, seed {row['seed']}")
    trials = store.trials(exp_id)
    counts = status_counts(trials)
    out.print("trials: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v))
    envs = store.environments(exp_id)
    if envs:
        e = envs[0]
        out.print(terminal.escape(f"environment: kernel {e['kernel']}, {e['cpus']} x "
                                  f"{e['cpu_model']}, mmlab {e['mmlab_version']} "
                                  f"({e['git_commit']})"))
    order = " ".join(f"{t.position}:{t.arm}" for t in trials[:30])
    out.print(terminal.escape(f"order: {order}{' ...' if len(trials) > 30 else ''}"))
    out.print(terminal.arm_summary_table(plan.workload, store.samples_by_arm(exp_id),
                                         plan.profile.metrics))


@app.command()
def compare(exp_id: int = typer.Argument(...), results: Path = RESULTS,
            as_json: bool = typer.Option(False, "--json", help="a JSON list of comparisons"),
            as_csv: bool = typer.Option(False, "--csv", help="CSV, one comparison per row")) -> None:
    """Verdicts per metric and pair of arms, with CIs, p-values and the state audit."""
    store = Store(results)
    plan = store.plan(exp_id)
    if not (as_json or as_csv):
        _print_comparison(store, exp_id, plan)
        return
    judged = verdicts.judge(plan, store.measurements(exp_id)).comparisons
    rows = [c.as_dict() if as_json else c.as_row() for c in judged]
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["metric"])
    writer.writeheader()
    writer.writerows(rows)
    typer.echo(buf.getvalue(), nl=False)


@app.command()
def report(exp_id: int = typer.Argument(...), results: Path = RESULTS,
           fmt: str = typer.Option("text", "--format", help="text (mailing list) or html"),
           output: Path = typer.Option(None, "--output", "-o", help="write to this file")) -> None:
    """A report of one experiment, also of an interrupted or partly failed one."""
    from mmlab.report import data, html, text
    if fmt not in ("text", "html"):
        raise MmlabError(f"--format {fmt!r}: expected text or html")
    d = data.gather(Store(results), exp_id)
    body = text.render(d) if fmt == "text" else html.render(d)
    if output:
        output.write_text(body)
        typer.echo(f"wrote {output}", err=True)
    else:
        typer.echo(body, nl=False)


@app.command()
def bundle(exp_id: int = typer.Argument(...), directory: Path = typer.Argument(...),
           results: Path = RESULTS,
           tar: bool = typer.Option(False, "--tar", help="also pack DIRECTORY.tar.gz")) -> None:
    """An evidence bundle a maintainer can audit: report, profile, environment,
    order, raw and summary data, attribution, plots, reproducers, manifest."""
    from mmlab.report import bundle as bundler
    from mmlab.report import data
    if directory.exists() and not directory.is_dir():
        raise MmlabError(f"{directory}: exists and is not a directory")
    path = bundler.write(data.gather(Store(results), exp_id), directory, tar)
    typer.echo(f"wrote {path}")


@app.command()
def narrow(profile: Path = typer.Argument(..., help="a [matrix] profile; its kernel axis is "
                                                    "replaced"),
           kernel_list: str = typer.Option(None, "--kernels",
                                           help="K1,K2,...,Kn ordered oldest to newest; a "
                                                "release range debian:6.12..debian:7.3 is one "
                                                "kernel per release series"),
           source: Path = typer.Option(None, "--source", help="a git kernel tree (with --commits)"),
           commit_range: str = typer.Option(None, "--commits",
                                            help="OLD..NEW: build and narrow commit by commit"),
           config: list[Path] = typer.Option([], "--config", help="fragments for commit builds"),
           metric: str = typer.Option(None, "--metric", help="default: the profile's first"),
           results: Path = RESULTS, allow_host_changes: bool = ALLOW) -> None:
    """Find the first step in K1..Kn (or in the commits OLD..NEW of a git tree)
    where METRIC changes, by binary search, each step a real two-kernel
    experiment judged like any other."""
    from mmlab.kernels import kbuild
    from mmlab.run import narrow as narrowing
    plan = experiment.load(profile)
    if plan.warnings():
        raise MmlabError(plan.warnings()[0])
    metric = metric or plan.profile.metrics[0]
    plan.workload.metric(metric)
    if bool(kernel_list) == bool(source and commit_range):
        raise MmlabError("narrow takes either --kernels K1,...,Kn or --source TREE --commits A..B")
    if kernel_list:
        names = kernels.expand([k.strip() for k in kernel_list.split(",") if k.strip()])
        ensure = lambda name: None  # noqa: E731
    else:
        shas = kbuild.commits(source, commit_range)
        names = [f"build:{c[:12]}" for c in shas]
        by_name = dict(zip(names, shas))

        def ensure(name: str) -> None:
            """Build a commit's kernel the first time the search needs it."""
            _build(str(kbuild.checkout(source, by_name[name])), [], config, name[6:])
    store = Store(results)
    out = terminal.console()

    def compare_pair(ref: str, kernel: str):
        ensure(ref)
        ensure(kernel)
        c = narrowing.experiment_step(store, plan, ref, kernel, metric,
                                      TargetPool(allow_host_changes, terminal.plain(out)))
        out.print(terminal.escape(f"  {c.arm} vs {c.baseline}: {c.verdict}, ratio "
                                  f"{c.ratio:.3f} [{c.ci_low:.3f}, {c.ci_high:.3f}], "
                                  f"p {c.p_value:.2g} ({c.reason})"))
        return c

    result = narrowing.bisect(names, compare_pair)
    for step in result.steps:
        out.print(terminal.escape(f"  {step.kernel}: {'changed' if step.changed else 'unchanged'}"
                                  f" ({step.why})"))
    out.print(f"{metric}: " + result.sentence(names) +
              f" ({len(result.steps)} of {len(names) - 1} kernels tested)")


@kernels_app.command("add")
def kernels_add(spec: str = typer.Argument(..., help="debian:6.12, debian:7.3.4, "
                                                   "debian:6.12-generic, or a bzImage"),
                config: Path = typer.Option(None, "--config", help="the .config of a local image"),
                name: str = typer.Option(None, "--name", help="name for a local image")) -> None:
    """Fetch a Debian kernel from the catalog of every suite (apt, nothing
    installed) or register a local bzImage."""
    if spec.startswith("debian:"):
        if kernels.is_range(spec):
            for one in kernels.expand([spec]):
                kernels_add(one, None, None)
            return
        k = kernels.add_debian(spec.removeprefix("debian:"))
    else:
        if config is None:
            raise MmlabError(f"{spec}: a local image needs --config path/to/.config")
        k = kernels.add_local(Path(spec), config, name)
    typer.echo(f"{k.name}: {k.identity()} from {k.source}, config sha256 "
               f"{k.config_sha256[:12]}, {len(k.modules)} guest modules, in {k.dir}")


@kernels_app.command("available")
def kernels_available(series: str = typer.Argument(None, help="a release series (6.12) for "
                                                              "every version in it"),
                      refresh: bool = typer.Option(False, "--refresh",
                                                   help="read the package lists again now"),
                      as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """What the Debian catalog can fetch: each release series with its newest
    patch level, flavour, suite and packaging (or every version of SERIES)."""
    apt = kernels.Apt()
    apt.refresh(force=refresh)
    found = kernels.entries(apt.catalog())
    if series:
        if not re.fullmatch(r"\d+\.\d+", series):
            raise MmlabError(f"{series}: expected a release series like 6.12")
        rows = [e for e in found if e.series == series]
        if not rows:
            raise MmlabError(f"no {series} kernels in the Debian catalog (release series it has: "
                             f"{', '.join(kernels.series_available(apt))})")
    else:
        newest: dict[tuple[str, str], kernels.Entry] = {}
        for e in found:            # sorted oldest first: the last one wins
            newest[(e.series, e.flavour)] = e
        rows = sorted(newest.values(), key=lambda e: (e.flavour, kernels._series_key(e.series)))
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(e) for e in rows], indent=1))
        return
    typer.echo(f"{'name':<22} {'newest' if not series else 'version':<10} {'package version':<22} "
               f"{'flavour':<8} {'suite':<18} packaging")
    for e in rows:
        flav = "" if e.flavour == "cloud" else f"-{e.flavour}"
        name = f"debian:{e.upstream if series else e.series}{flav}"
        typer.echo(f"{name:<22} {e.upstream:<10} {e.package_version:<22} {e.flavour:<8} "
                   f"{e.suite:<18} {e.packaging}")
    typer.echo(f"suites read: {', '.join(apt.served())}", err=True)


def _build(source: str, patches: list[Path], fragments: list[Path], name: str | None):
    """kbuild.build with a live line: the file being compiled and how many so far."""
    from rich.status import Status

    from mmlab.kernels import kbuild
    count = 0
    with Status(f"building {source}", console=terminal.console()) as status:
        def on_line(line: str) -> None:
            nonlocal count
            count += 1
            status.update(terminal.escape(f"building {source}: {count} steps, {line.strip()[:70]}"))
        return kbuild.build(source, patches, fragments, name, on_line=on_line)


@kernels_app.command("build")
def kernels_build(source: str = typer.Argument(..., help="debian-source:6.12 or a kernel tree"),
                  patch: list[Path] = typer.Option([], "--patch", help="a patch (-p1), repeatable"),
                  config: list[Path] = typer.Option([], "--config",
                                                    help="a config fragment, repeatable"),
                  name: str = typer.Option(None, "--name", help="name it build:NAME")) -> None:
    """Build a kernel for guests from source, cached by its inputs."""
    k = _build(source, patch, config, name)
    typer.echo(f"{k.name}: {k.version} ({k.source}), config sha256 {k.config_sha256[:12]}, "
               f"build key {k.details['build_key'][:12]}")


@app.command()
def ab(profile: Path = typer.Argument(..., help="a [matrix] profile; the kernel axis is A, B"),
       patch: list[Path] = typer.Option(..., "--patch", help="the change under test (B)"),
       source: str = typer.Option("debian-source:6.12", "--source"),
       config: list[Path] = typer.Option([], "--config", help="fragments for both A and B"),
       results: Path = RESULTS, allow_host_changes: bool = ALLOW,
       attribute: bool = ATTRIBUTE) -> None:
    """Patch A/B: build A (unpatched) and B (patched) from the same source and
    config, run PROFILE on both interleaved in QEMU, and judge B against A."""
    import hashlib
    plan = experiment.load(profile)
    a = _build(source, [], config, None)
    b = _build(source, patch, config, None)
    sums = ", ".join(f"{p.name} sha256 {hashlib.sha256(p.read_bytes()).hexdigest()[:16]}"
                     for p in patch)
    derived = experiment.with_kernels(plan, [a.name, b.name], f"A/B of {sums}")
    store = Store(results)
    exp_id = store.create_experiment(derived)
    typer.echo(f"A = {a.name} ({a.source}); B = {b.name} ({b.source}); experiment {exp_id}",
               err=True)
    _run_plan(store, exp_id, derived, TargetPool(allow_host_changes), attribute)


@kernels_app.command("list")
def kernels_list() -> None:
    """The cached kernels and the features their configs enable."""
    terminal.console().print(terminal.kernels_table(kernels.cached()))


@app.command("probe")
def probe_cmd(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """What this machine offers and lacks, measured now."""
    facts = probe.facts()
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(f) for f in facts], indent=1))
        return
    terminal.console().print(terminal.probe_table(facts))


fleet_app = typer.Typer(no_args_is_help=True,
                        help="A lab of many machines: workers, queues, verdicts per machine.")
app.add_typer(fleet_app, name="fleet")
store_app = typer.Typer(no_args_is_help=True, help="The store itself.")
app.add_typer(store_app, name="store")
BROKER = typer.Option("redis://localhost:6379/0", "--broker", envvar="MMLAB_BROKER",
                      help="the fleet's broker (Redis); its queues hold the planned trials")


@app.command()
def worker(name: str = typer.Option(..., "--name", help="this machine's name in the fleet"),
           results: Path = RESULTS, broker: str = BROKER) -> None:
    """Serve this lab machine: register its probe in the shared store, then
    run the trials of its own queue one at a time until stopped."""
    from mmlab.fleet import worker as fleet_worker
    fleet_worker.serve(name, results, broker)


@fleet_app.command("status")
def fleet_status(results: Path = RESULTS) -> None:
    """The registered machines: whether their workers answer, what waits in
    their queues, what they run now."""
    from mmlab.fleet import summary, tables
    terminal.console().print(tables.status_table(summary.status(Store(results))))


@fleet_app.command("summary")
def fleet_summary(exp_id: int = typer.Argument(..., help="any experiment of the fleet run"),
                  results: Path = RESULTS) -> None:
    """Each machine's verdicts side by side: where the change reproduced."""
    from mmlab.fleet import coordinator
    store = Store(results)
    _print_fleet(store, coordinator.members(store, exp_id))


@store_app.command("copy")
def store_copy(source: str = typer.Argument(..., help="a lab directory or postgresql:// URL"),
               destination: str = typer.Argument(..., help="a lab directory or postgresql:// URL")
               ) -> None:
    """Copy every experiment of SOURCE into DESTINATION (a lab directory's
    SQLite into a fleet's PostgreSQL, or back); ones already there are skipped."""
    from mmlab.store import transfer
    for line in transfer.copy(Store(source), Store(destination)):
        typer.echo(line)


@app.command()
def restore() -> None:
    """Put back every global setting an interrupted mmlab left changed."""
    journal = knobs.Journal()
    if not journal.path.exists():
        typer.echo("nothing to restore")
        return
    done = journal.restore()
    typer.echo("restored: " + ("; ".join(done) if done else "(nothing had changed)"))


@selftest_app.command("verdicts")
def selftest_verdicts(experiments: int = typer.Option(2000, "--experiments", min=10,
                                                      help="simulated profiles per cell"),
                      seed: int = typer.Option(1, "--seed")) -> None:
    """The verdicts' operating characteristics at the defaults, by simulation:
    false alarms, "no change" in A/A runs, power and rounds used; exit status 1
    when a target is missed."""
    if selftest.print_report(experiments, seed):
        raise typer.Exit(1)


def _interrupt(_signo: int, _frame: object) -> None:
    raise Interrupted


def main() -> None:
    """The one error policy: every failure the user can cause or meet (bad
    input, a usage error, a missing tool, a file that cannot be read or
    written) is one line on stderr and exit status 2; Ctrl-C is 130."""
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        status = app(standalone_mode=False)
    except typer.TyperException as exc:   # click's usage errors, as typer vendors them
        if type(exc).__name__ == "NoArgsIsHelpError":
            exc.show()
            sys.exit(2)
        ctx = getattr(exc, "ctx", None)
        where = f" {ctx.command_path.removeprefix('mmlab').strip()}" if ctx else ""
        _fail(f"mmlab{where}: {exc.format_message()}")
    except MmlabError as exc:
        _fail(f"mmlab: {exc}")
    except OSError as exc:
        _fail(f"mmlab: {exc.filename or ''}{': ' if exc.filename else ''}"
              f"{exc.strerror or exc}")
    except (Interrupted, typer.Abort):
        typer.echo("mmlab: interrupted; global settings restored", err=True)
        sys.exit(130)
    sys.exit(status if isinstance(status, int) else 0)


def _fail(line: str) -> None:
    typer.echo(" ".join(line.split()), err=True)
    sys.exit(2)
