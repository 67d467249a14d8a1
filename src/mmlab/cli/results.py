"""The commands that read stored experiments: experiments, show, compare,
explain, report, bundle.  They never parse a profile, run mmwork or create a
store, and open the store read-only: one in a read-only directory is read."""

from __future__ import annotations

from pathlib import Path

import typer

from mmlab.cli import options
from mmlab.cli.options import EXPERIMENT, JSON, RESULTS
from mmlab.errors import MmlabError


def experiments(results: str = RESULTS) -> None:
    """List the experiments in the store.

    Example: mmlab experiments --results mmlab-results"""
    rows = options.open_store(results).experiments()
    from mmlab.report import terminal
    from mmlab.report.terminal import experiment
    terminal.console().print(experiment.experiments_table(rows))


def show(exp_id: int = EXPERIMENT, results: str = RESULTS) -> None:
    """One experiment: its profile, environment, execution order and per-arm figures.

    Example: mmlab show 1"""
    store = options.open_store(results)
    from mmlab.report import terminal
    from mmlab.report.terminal import experiment
    experiment.print_experiment(terminal.console(), store, exp_id)


def compare(exp_id: int = EXPERIMENT, results: str = RESULTS,
            as_json: bool = typer.Option(False, "--json", help="a JSON list of comparisons, "
                                         "each with what a count counts and the audit's findings"),
            as_csv: bool = typer.Option(False, "--csv", help="CSV, one comparison per row, "
                                        "the same as columns")
            ) -> None:
    """Verdicts per metric and pair of arms, with CIs, p-values and the
    same-state audit (see docs/verdicts.md for how to read them).

    Example: mmlab compare 1 --csv > verdicts.csv"""
    if as_json and as_csv:
        raise MmlabError("compare: --json and --csv: choose one")
    store = options.open_store(results)
    from mmlab.judge import verdicts
    from mmlab.report import csv as report_csv
    from mmlab.report import json as report_json
    from mmlab.report import terminal
    from mmlab.report.terminal import experiment
    plan = store.plan(exp_id)
    measured = store.measurements(exp_id)
    judged = verdicts.judge(plan, measured)
    if as_json:
        typer.echo(report_json.comparisons(plan, judged, measured.by_arm))
    elif as_csv:
        typer.echo(report_csv.comparisons(plan, judged, measured.by_arm), nl=False)
    else:
        experiment.print_verdicts(terminal.console(), exp_id, plan, measured, judged)


def explain(exp_id: int = EXPERIMENT, results: str = RESULTS, as_json: bool = JSON,
            focus: str = typer.Option(None, "--focus", metavar="FUNCTION",
                                      help="only stacks through this function, e.g. do_madvise "
                                           "for the pageout phase"),
            svg: Path = typer.Option(None, "--svg", metavar="DIR",
                                     help="write flame graphs (per arm and differential) into "
                                          "this directory")) -> None:
    """Where the time went per arm, and what carries each arm's difference
    from its baseline (needs an experiment run with --attribute).

    Example: mmlab explain 4 --focus do_madvise --svg flames/"""
    store = options.open_store(results)
    from mmlab.attribution import explain as ex
    from mmlab.report import json as report_json
    from mmlab.report import terminal
    from mmlab.report.terminal import attribution
    plan = store.plan(exp_id)
    attributed = ex.load(store.attributions(exp_id))
    if not attributed:
        raise MmlabError(f"experiment {exp_id} has no attribution: run it with --attribute "
                         f"(mmlab experiment resume {exp_id} --attribute adds it)")
    found = ex.explain_experiment(plan, attributed, store.samples_by_arm(exp_id),
                                  focus or plan.profile.focus)
    if svg:
        from mmlab.report import flamegraph
        for path in flamegraph.write(svg, found):
            typer.echo(f"wrote {path}", err=True)
    if as_json:
        typer.echo(report_json.explanation(found))
    else:
        attribution.print_explanation(terminal.console(), plan, found)


def report(exp_id: int = EXPERIMENT, results: str = RESULTS,
           fmt: str = typer.Option("text", "--format", metavar="text|html",
                                   help="text (for a mailing list) or html (self-contained)"),
           output: Path = typer.Option(None, "--output", "-o", metavar="FILE",
                                       help="write to this file")) -> None:
    """A report of one experiment, also of an interrupted or partly failed one.

    Example: mmlab report 1 --format html -o report.html"""
    from mmlab.report import data, html, text
    if fmt not in ("text", "html"):
        raise MmlabError(f"--format {fmt!r}: expected text or html")
    d = data.gather(options.open_store(results), exp_id)
    body = text.render(d) if fmt == "text" else html.render(d)
    if output:
        output.write_text(body)
        typer.echo(f"wrote {output}", err=True)
    else:
        typer.echo(body, nl=False)


def bundle(exp_id: int = EXPERIMENT,
           directory: Path = typer.Argument(..., metavar="DIR", help="where to write it"),
           results: str = RESULTS,
           tar: bool = typer.Option(False, "--tar", help="also pack DIR.tar.gz")) -> None:
    """An evidence bundle a maintainer can audit: report, profile, environment,
    order, raw and summary data, attribution, plots, reproducers, manifest.

    Example: mmlab bundle 1 evidence/ --tar"""
    from mmlab.report import bundle as bundler
    from mmlab.report import data
    if directory.exists() and not directory.is_dir():
        raise MmlabError(f"{directory}: exists and is not a directory")
    path = bundler.write(data.gather(options.open_store(results), exp_id), directory, tar)
    typer.echo(f"wrote {path}")


COMMANDS = (experiments, show, compare, explain, report, bundle)
