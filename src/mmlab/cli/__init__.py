"""The `mmlab` command: thin modules that parse, call one library function
and render, over the library laid out by stage (see docs/DESIGN.md).

  experiments.py  experiment plan|run|resume (here or on fleet machines)
  run.py          run WORKLOAD: one workload, one trial, one subcommand each
  results.py      experiments, show, compare, explain, report, bundle
  kernels.py      kernels add|available|list|build, ab, narrow
  fleet.py        worker, fleet status|summary, store copy
  machine.py      workloads, header, probe, restore, selftest
  census.py       census: how many VMAs share one anon_vma, per process
  track.py        track run|report: the release tracker; selftest changepoints
  check.py        check PATCH...: a patch series against its base, as the test robot reports
  options.py      the options several commands share

One error policy (`main`): every failure a user can cause or meet is one line
on stderr and exit status 2; Ctrl-C is 130 after the journal restored every
global setting.
"""

from __future__ import annotations

import signal
import sys

import typer

from mmlab import __version__
from mmlab.cli import baremetal, census, check, experiments, fleet, kernels, machine, results, track
from mmlab.cli import run as run_cmd
from mmlab.errors import Interrupted, MmlabError
from mmlab.machine import paths

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Reproduce, measure and explain Linux mm performance reports. "
                       "Start with `mmlab probe`, `mmlab workloads` and the README.")
app.add_typer(run_cmd.app, name="run")
app.add_typer(experiments.app, name="experiment")
app.add_typer(kernels.app, name="kernels")
app.add_typer(fleet.fleet_app, name="fleet")
app.add_typer(fleet.store_app, name="store")
app.add_typer(machine.selftest_app, name="selftest")
app.add_typer(track.app, name="track")
app.add_typer(baremetal.app, name="bare-metal")
machine.selftest_app.command("changepoints")(track.selftest_changepoints)
for command in results.COMMANDS:
    app.command()(command)
app.command("ab")(kernels.ab)
app.command("narrow")(kernels.narrow)
app.command("check")(check.check)
app.command("worker")(fleet.worker)
app.command("workloads")(machine.workloads_cmd)
app.command("header")(machine.header)
app.command("probe")(machine.probe_cmd)
app.command("restore")(machine.restore)
app.command("census", context_settings={"allow_extra_args": True,
                                        "ignore_unknown_options": True})(census.census)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mmlab {__version__}")
        raise typer.Exit


@app.callback()
def _startup(version: bool = typer.Option(False, "--version", callback=_version,
                                          is_eager=True, help="print mmlab's version")) -> None:
    """Before any command: undo what a crashed mmlab left changed (the
    settings code loads only when a journal is there to replay).  The
    state folder and the lock's path are checked first, so that a bad one
    is refused before any command makes a store or a cache."""
    paths.env_file("MMLAB_LOCK")
    if not paths.journal_path().exists():
        return
    from mmlab.machine import knobs
    from mmlab.machine.journal_trust import UntrustedJournal
    try:
        restored = knobs.replay_orphaned()
    except UntrustedJournal:
        raise                   # one mmlab did not write: no command runs beside it
    except MmlabError as exc:
        typer.echo(f"mmlab: warning: {exc}", err=True)
        return
    if restored:
        typer.echo("mmlab: an earlier run did not finish; restored: " + "; ".join(restored),
                   err=True)


def _interrupt(_signo: int, _frame: object) -> None:
    raise Interrupted.arrived()


def main() -> None:
    """The one error policy: every failure the user can cause or meet (bad
    input, a usage error, a missing tool, a file that cannot be read or
    written) is one line on stderr and exit status 2; Ctrl-C is 130."""
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        if sys.argv[1:2] == ["run"]:
            run_cmd.register()          # reads mmwork's table: only when it is wanted
        status = app(standalone_mode=False, prog_name="mmlab")
    except typer.TyperException as exc:   # click's usage errors, as typer vendors them
        if type(exc).__name__ == "NoArgsIsHelpError":
            exc.show()                # type: ignore[attr-defined]  # click's NoArgsIsHelpError
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
