"""`mmlab run WORKLOAD`: one workload, one trial of N samples, on this kernel
or in a guest, through the same profile parser, Target and store as
`experiment run` (experiment/single.py).

Each workload is a subcommand made from its own table (`mmwork describe`),
so `mmlab run WORKLOAD --help` lists that workload's parameters with their
defaults, and `exec` runs any command or C file.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer

from mmlab.cli import options
from mmlab.errors import MmlabError
from mmlab.experiment.limits import MAX_SAMPLES

if TYPE_CHECKING:
    from mmlab import workloads
    from mmlab.cli.display import Display
    from mmlab.experiment import single
    from mmlab.run import driver

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                  help="Run one workload on this kernel or, with --kernel, in a guest. "
                       "Example: mmlab run pageout-refault --thp hugepage --samples 3")

# Options every workload takes, beside its own parameters: (name, type, option).
COMMON = (
    ("samples", int, typer.Option(5, "--samples", min=1, max=MAX_SAMPLES, metavar="N",
                                  help="samples in the one trial (one mmwork process; one boot "
                                       "in a guest)")),
    ("kernel", str, typer.Option("host", "--kernel", metavar="KERNEL",
                                 help="run in a QEMU guest: debian:6.12, local:NAME, build:NAME")),
    ("bare_metal", bool, typer.Option(False, "--bare-metal",
                                      help="kexec --kernel on the bare-metal machine "
                                           "$MMLAB_BARE_METAL names, instead of a guest")),
    ("vcpus", int, typer.Option(None, "--vcpus", min=1, metavar="N", help="guest vCPUs (1)")),
    ("memory_mb", int, typer.Option(None, "--memory-mb", min=128, metavar="N",
                                    help="guest memory in MiB (1024)")),
    ("numa_nodes", int, typer.Option(None, "--numa-nodes", min=1, max=8, metavar="N",
                                     help="guest NUMA nodes, memory split evenly (1)")),
    ("count_insns", bool, typer.Option(False, "--insns",
                                       help="also count kernel and user instructions per unit "
                                            "in the timed windows (a separate counting pass)")),
    ("count_events", bool, typer.Option(False, "--events",
                                        help="TCG guest only: with the instructions, count "
                                             "loads, stores, locked instructions, TLB flushes, "
                                             "IPIs, rep strings and retired instructions (a "
                                             "slower counting pass)")),
    ("trace_count", str, typer.Option("", "--trace-count", metavar="FUNC,FUNC",
                                      help="guest only: count calls of these functions")),
    ("trace_time", str, typer.Option("", "--trace-time", metavar="FUNC,FUNC",
                                     help="guest only: time every call of these functions")),
    ("functions", int, typer.Option(0, "--functions", min=0, metavar="N",
                                    help="TCG guest only: count kernel instructions by function "
                                         "in one more boot; print the top N per window")),
    ("as_json", bool, typer.Option(False, "--json",
                                   help="print the samples as JSON lines and nothing else")),
    ("allow_host_changes", bool, options.ALLOW),
    ("results", str, options.RESULTS),
)
EXEC = (
    ("source", Path, typer.Option(None, "--source", metavar="FILE.c",
                                  help="a C reproducer: compiled statically (cached) and run; "
                                       "its arguments after --")),
    ("metrics_from", str, typer.Option(None, "--metrics-from", metavar="FORMAT",
                                       help="where the figures are: stress-ng-yaml (with -Y "
                                            "{out}), key=value or json")),
    ("metric", list[str], typer.Option([], "--metric", metavar="NAME[=KEY]:higher|lower",
                                       help="a figure the command prints (repeatable)")),
    ("smaps", bool, typer.Option(False, "--smaps", help="the command's smaps at its exit")),
    ("per", str, typer.Option(None, "--per", metavar="KEY",
                              help="with --insns: the command's instructions per this output "
                                   "figure (pages, bogo-ops); default per run")),
    ("window", list[str], typer.Option([], "--window", metavar="NAME=ID[:KEY]",
                                       help="a window the program marks with mmlab.h's "
                                            "MMLAB_BEGIN(ID)/MMLAB_END(ID), counted per the "
                                            "output figure KEY of one window (repeatable)")),
    ("timeout_s", float, typer.Option(600, "--timeout-s", min=0.001, metavar="SECONDS",
                                      help="kill the command after this long")),
)
METAVAR = {"int": "N", "size_kb": "SIZE", "bytes": "BYTES", "float": "X", "path": "PATH"}


def register() -> None:
    """One subcommand per workload in mmwork's table, and `exec`."""
    from mmlab import workloads
    for wl in workloads.registry().values():
        seed = f" (seed {wl.seed})" if wl.seed else ""
        app.command(wl.name, help=f"{wl.summary}{seed}. mm paths: "
                                  f"{', '.join(wl.mm_paths)}.",
                    epilog=f"Example: mmlab run {wl.name} --samples 3")(workload_command(wl))
    app.command("exec", context_settings={"allow_extra_args": True,
                                          "ignore_unknown_options": True},
                help="Any command (after --) or C file as a workload, measured from outside.",
                epilog="Example: mmlab run exec --metrics-from stress-ng-yaml -- stress-ng "
                       "--mremap 2 -t 5 -Y {out}")(exec_command())


def workload_command(wl: workloads.Workload) -> Callable[..., None]:
    """A command whose options are `wl`'s parameters and the common ones."""
    from mmlab.workloads import HARNESS_PARAMS
    mine = {p.name.replace("-", "_"): p for p in wl.params
            if p.name not in (*HARNESS_PARAMS, "insns")}

    def command(**values: object) -> None:
        from mmlab.experiment import single
        params = {p.name: values.pop(key) for key, p in mine.items()}
        run(single.Request(wl.name, {k: v for k, v in params.items() if v not in (None, False)},
                           **_common(values)), values)
    own = [(key, *_option(p)) for key, p in mine.items()]
    return _with_signature(command, own + list(COMMON))


def exec_command() -> Callable[..., None]:
    """`mmlab run exec [--source FILE.c] -- CMD ARGS...`."""
    def command(ctx: typer.Context, **values: object) -> None:
        from mmlab.experiment import single
        from mmlab.workloads import execwork
        source = cast("Path | None", values.pop("source"))
        declared = cast("list[str]", values.pop("metric"))
        marked = cast("list[str]", values.pop("window"))
        keys: dict[str, object] = {
            "command": ["{source}", *ctx.args] if source else list(ctx.args),
            "metrics_from": values.pop("metrics_from"), "smaps": values.pop("smaps"),
            "timeout_s": values.pop("timeout_s"), "per": values.pop("per"),
            "exec_metrics": {name: m.model_dump(exclude_none=True) for name, m in
                             map(execwork.parse_metric_option, declared)},
            "windows": {name: w.model_dump(exclude_none=True) for name, w in
                        map(execwork.parse_window_option, marked)}}
        if source:
            keys["source"] = str(Path(source).resolve())    # read and checked by execwork
        run(single.Request("exec", exec_keys={k: v for k, v in keys.items() if v is not None},
                           **_common(values)), values)
    ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                            annotation=typer.Context)
    return _with_signature(command, list(EXEC) + list(COMMON), first=ctx)


def run(req: single.Request, rest: dict) -> None:
    """Plan, store and run the one-arm experiment (driver.run_experiment);
    print its samples (and traces and functions) from the store."""
    from mmlab.cli.display import Display
    from mmlab.experiment import single
    from mmlab.report.terminal import experiment
    from mmlab.run import driver
    from mmlab.targets import TargetPool
    plan = single.plan(req)
    show = Display(stderr=True, quiet=rest["as_json"])
    here = driver.Here(TargetPool(rest["allow_host_changes"], show.say))
    with show:
        outcome = driver.run_experiment(rest["results"], plan, here,
                                        driver.Options(req.attribute, with_controls=False), show)
    failed = outcome.failed[outcome.exp_id]
    if failed:
        raise MmlabError(f"the trial failed: {failed[0].error}")
    samples = outcome.result.measured.by_arm[single.ARM]
    if rest["as_json"]:
        for s in samples:
            typer.echo(s.model_dump_json())
        return
    experiment.print_samples(show.out, plan.workload, samples)
    if req.attribute:
        _print_functions(show, outcome, req)
    typer.echo(f"stored as experiment {outcome.exp_id} in {outcome.store.where} "
               f"(mmlab show {outcome.exp_id})", err=True)


def _print_functions(show: Display, outcome: driver.Outcome, req: single.Request) -> None:
    """What the attribution runs found, by kernel function."""
    from mmlab.attribution import explain
    from mmlab.report.terminal import attribution
    plan = outcome.result.plan
    found = explain.explain_experiment(plan, explain.load(outcome.store.attributions(
        outcome.exp_id)), outcome.result.measured.by_arm, n=req.functions or 12)
    if req.functions and not found.functions:
        windows = ", ".join(w.name for w in plan.workload.windows) or "none"
        raise MmlabError(f"--functions: no timed window of {plan.workload.name} did any "
                         f"work here (windows: {windows})")
    attribution.print_explanation(show.out, plan, found)


def _common(values: dict) -> dict:
    """The Request fields among the common options (the rest stay in `values`)."""
    def split(text: str) -> tuple[str, ...]:
        return tuple(f for f in text.split(",") if f)
    return {"samples": values["samples"], "kernel": values["kernel"],
            "bare_metal": values["bare_metal"], "vcpus": values["vcpus"],
            "memory_mb": values["memory_mb"], "numa_nodes": values["numa_nodes"],
            "count_insns": values["count_insns"], "count_events": values["count_events"],
            "trace_count": split(values["trace_count"]),
            "trace_time": split(values["trace_time"]), "functions": values["functions"],
            "argv": tuple(sys.argv[2:])}


def _option(p: workloads.Param) -> tuple[type, object]:
    """A workload parameter as a typer option: flags are booleans, the rest
    text checked by mmwork itself when the profile is read."""
    help_text = p.help + ("" if p.type == "flag" else f" (default {p.default})")
    if p.type == "flag":
        return bool, typer.Option(False, f"--{p.name}", help=help_text)
    metavar = "|".join(p.choices) if p.type == "choice" else METAVAR.get(p.type, "VALUE")
    return str, typer.Option(None, f"--{p.name}", metavar=metavar, help=help_text)


def _with_signature(func: Callable[..., None], params: list[tuple[str, type, object]],
                    first: inspect.Parameter | None = None) -> Callable[..., None]:
    """`func` with the keyword parameters typer reads options from."""
    sig = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                             annotation=kind) for name, kind, option in params]
    signature = inspect.Signature(([first] if first else []) + sig)
    func.__signature__ = signature       # type: ignore[attr-defined]  # read by typer
    func.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    return func
