"""`mmlab track run|report SUITE` and `mmlab selftest changepoints`: every
release measured on a suite of profiles, change points found and confirmed,
shown on one page.  The tracker (ruptures, matplotlib) loads only when one
of these commands runs."""

from __future__ import annotations

from pathlib import Path

import typer

from mmlab.cli import options
from mmlab.cli.options import ALLOW, RESULTS
from mmlab.report import terminal
from mmlab.store import Store
from mmlab.targets import TargetPool

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                  help="The release tracker: every kernel of a suite, change points confirmed.")
SUITE = typer.Argument(..., metavar="SUITE", help="a suite (experiments/suites/*.toml)")


@app.command("run")
def run_cmd(suite_path: Path = SUITE, results: str = RESULTS, allow_host_changes: bool = ALLOW,
            refresh: bool = typer.Option(True, "--refresh/--no-refresh",
                                         help="read the Debian catalog again first")) -> None:
    """Measure every (profile, kernel) cell not yet stored against the
    suite's reference, then find and confirm the change points.

    Example: mmlab track run experiments/suites/seeds.toml --results track-seeds"""
    from mmlab.track import dashboard, session, suite
    found = suite.load(suite_path)
    out = terminal.console()
    result = session.run(Store(results), found, TargetPool(allow_host_changes,
                                                           terminal.plain(out)),
                         refresh, terminal.plain(out))
    if not result.measured and not result.confirmations:
        out.print(f"nothing new: every cell of {found.name} is stored "
                  f"({len(found.profiles)} profile(s) x {len(found.kernels) - 1} kernel(s))")
    typer.echo(dashboard.text(found, result), nl=False)


@app.command("report")
def report_cmd(suite_path: Path = SUITE, results: str = RESULTS,
               output: Path = typer.Option(..., "--output", "-o", metavar="DIR",
                                           help="where the dashboard goes")) -> None:
    """The dashboard of what the store holds (nothing is measured): trend
    plots with the change points, the changes, an Atom feed, text and JSON.

    Example: mmlab track report experiments/suites/seeds.toml -o dashboard/"""
    from mmlab.track import dashboard, session, suite
    found = suite.load(suite_path)
    result = session.run(options.open_store(results), found, TargetPool(), refresh=False,
                         measure=False)
    for path in dashboard.write(output, found, result):
        typer.echo(f"wrote {path}", err=True)


def selftest_changepoints(series: int = typer.Option(1000, "--series", min=10, metavar="N",
                                                     help="simulated series per case"),
                          seed: int = typer.Option(1, "--seed", metavar="N",
                                                   help="the simulation's random seed")) -> None:
    """The tracker's operating characteristics by simulation: false candidates
    and false confirmed changes in 20-release A/A series, and how often steps
    are confirmed; exit status 1 when a target is missed.

    Example: mmlab selftest changepoints --series 2000 --seed 1"""
    from mmlab.track import simulate
    rates = simulate.run(series, seed)
    terminal.console().print(terminal.changepoint_table(rates))
    missed = simulate.Targets().missed(rates)
    typer.echo("targets: " + ("met" if not missed else "MISSED: " + "; ".join(missed)))
    if missed:
        raise typer.Exit(1)
