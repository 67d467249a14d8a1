"""`mmlab track run|report SUITE` and `mmlab selftest changepoints`: every
release measured on a suite of profiles, change points found and confirmed,
shown on one page.  The tracker (ruptures, matplotlib) loads only when one
of these commands runs."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from mmlab.cli import options
from mmlab.cli.options import ALLOW, RESULTS

if TYPE_CHECKING:
    from rich.console import Console

    from mmlab.track.cells import Failed

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                  help="The release tracker: every kernel of a suite, change points confirmed.")
SUITE = typer.Argument(..., metavar="SUITE", help="a suite (experiments/suites/*.toml)")


@app.command("run")
def run_cmd(suite_path: Path = SUITE, results: str = RESULTS, allow_host_changes: bool = ALLOW,
            refresh: bool = typer.Option(False, "--refresh",
                                         help="read the Debian registry now (otherwise when "
                                              "the catalog is a day old)"),
            machines: str = typer.Option(None, "--machines", metavar="NAME,NAME",
                                         help="spread the cells and confirmations over these "
                                              "fleet machines, one experiment per machine at a "
                                              "time; needs a postgresql:// store"),
            confirm_emulated: bool = typer.Option(
                False, "--confirm-emulated",
                help="confirm time steps measured in TCG guests in time too (otherwise the "
                     "pair's instruction counts decide them, and a profile that counts nothing "
                     "leaves them candidates)")) -> None:
    """Measure every (profile, release) cell not yet stored against the
    suite's reference, then find and confirm the change points; prints what
    changed, in the style of a 0-day report.  A time step measured in a TCG
    guest is emulated time: never a regression on its own.

    Example: mmlab track run experiments/suites/seeds.toml --results track-seeds"""
    from mmlab.cli.display import Display
    from mmlab.kernels import catalog
    from mmlab.report import text
    from mmlab.run import driver
    from mmlab.store import Store
    from mmlab.targets import TargetPool
    from mmlab.track import evidence, releases, session, spread, suite
    names = None
    if machines is not None:
        from mmlab import fleet
        names = fleet.machine_names(machines)
    if refresh:
        catalog.Apt().refresh(force=True)
    found = suite.load(suite_path)
    resolver = releases.Catalog()
    releases.check(resolver, found)
    store = Store(results)
    show = Display()
    here = driver.Here(TargetPool(allow_host_changes, show.say))
    spread_over = None
    if names:
        spread_over = spread.Fleet(store, names, spread.fleet_runner(store, results, names,
                                                                     allow_host_changes, show))
    started = time.monotonic()
    with show:
        result = session.run(store, found, here, resolver, show, fleet=spread_over,
                             confirm_emulated=confirm_emulated)
    took = time.monotonic() - started
    if not result.measured and not result.confirmations:
        show.out.print(f"nothing new: every cell of {found.name} is stored "
                       f"({len(found.profiles)} profile(s), {len(result.series)} series "
                       f"against {result.reference.name}); changes: "
                       f"{text.tally_line(result.changes)}")
        return
    shown = [evidence.gather(store, found, c, results, result.judged) for c in result.changes]
    typer.echo(text.track_summary(found, result, shown, only_new=True), nl=False)
    show.out.print(f"this run took {took / 60:.1f} min: {result.cells} cell(s) in "
                   f"{len(result.measured)} experiment(s), {len(result.confirmations)} "
                   "confirmation(s)")
    _exit_on_failed(result.failed, show.out)


def _exit_on_failed(failed: list[Failed], out: Console) -> None:
    """Exit status 1 when trials of this run failed (their releases' ratios
    rest on fewer rounds, or are missing from their series): one line per
    release, with the first error."""
    for f in failed:
        out.print(f"failed: {f.what} {f.profile} on {f.kernel}: {f.trials} trial(s): {f.error}",
                  markup=False, emoji=False, highlight=False)
    if failed:
        typer.echo(f"mmlab: {sum(f.trials for f in failed)} trial(s) failed in this run "
                   "(above: each release's first error); exit status 1", err=True)
        raise typer.Exit(1)


@app.command("report")
def report_cmd(suite_path: Path = SUITE, results: str = RESULTS,
               output: Path = typer.Option(..., "--output", "-o", metavar="DIR",
                                           help="where the dashboard goes"),
               bundles: bool = typer.Option(True, "--bundles/--no-bundles",
                                            help="each change's report and evidence bundle "
                                                 "under DIR/evidence/")) -> None:
    """The dashboard of what the store holds (nothing is measured): trend
    plots with the change points, the changes and their evidence (each
    confirmation's report and bundle), an Atom feed, a text summary and JSON.

    Example: mmlab track report experiments/suites/seeds.toml -o dashboard/"""
    from mmlab.report import dashboard
    from mmlab.run import driver
    from mmlab.targets import TargetPool
    from mmlab.track import evidence, releases, session, suite
    found = suite.load(suite_path)
    store = options.open_store(results)
    result = session.run(store, found, driver.Here(TargetPool()), releases.Catalog(),
                         measure=False)
    shown = [evidence.gather(store, found, c, results, result.judged) for c in result.changes]
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    bundled = dashboard.write_evidence(store, output, shown) if bundles else set()
    for path in dashboard.write(output, found, result, shown, now, bundled):
        typer.echo(f"wrote {path}", err=True)


def selftest_changepoints(series: int = typer.Option(1000, "--series", min=10, metavar="N",
                                                     help="simulated series per case"),
                          seed: int = typer.Option(1, "--seed", metavar="N",
                                                   help="the simulation's random seed")) -> None:
    """The tracker's operating characteristics by simulation: false candidates
    and false confirmed changes in 20-release A/A series, and how often steps
    are confirmed; exit status 1 when a goal is missed beyond the
    simulation's sampling error (a rate within it is reported, not missed).

    Example: mmlab selftest changepoints --series 2000 --seed 1"""
    from mmlab.report import terminal
    from mmlab.report.terminal import selftest as selftest_report
    from mmlab.track import simulate
    rates = simulate.simulate_all(series, seed)
    terminal.console().print(selftest_report.changepoint_table(rates))
    goals = simulate.ChangePointGoals()
    typer.echo("goals: " + goals.summary(rates))
    if goals.missed(rates):
        raise typer.Exit(1)
