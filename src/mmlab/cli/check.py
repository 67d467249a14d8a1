"""`mmlab check PATCH...`: a patch series built on a base kernel and
measured against it on counts, over a suite's profiles, reported as the
kernel test robot reports.

Exit status: 0 no change on any path checked; 1 a change was found (the
report says which); 2 bad input or a failure (a series that does not read
or apply, a base the catalog lacks, a build that fails, trials that
failed: no verdict rests on them)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from mmlab.cli.options import JSON, RESULTS

if TYPE_CHECKING:
    from mmlab.check.request import Request
    from mmlab.check.session import CheckResult
    from mmlab.run.events import OnEvent
    from mmlab.store import Store
    from mmlab.track.spread import Fleet

CHANGED = 1      # the exit status of a check that found a change
FAILED = 2       # as every error's (cli.main)


def check(patches: list[Path] = typer.Argument(None, metavar="PATCH",
                                               help="files from git format-patch, or one mbox "
                                                    "saved from a list archive"),
          tree: Path = typer.Option(None, "--tree", metavar="DIR",
                                    help="a kernel git tree: the series is its commits "
                                         "OLD..NEW (--commits), the base the tree at OLD"),
          commits: str = typer.Option(None, "--commits", metavar="OLD..NEW",
                                      help="with --tree: the commits to check"),
          base: str = typer.Option(None, "--base", metavar="BASE",
                                   help="debian-source:SERIES (default: the newest the catalog "
                                        "has) or a kernel tree"),
          suite: Path = typer.Option(None, "--suite", metavar="SUITE",
                                     help="the profiles to check (default: "
                                          "experiments/suites/mm.toml, the broad mm suite)"),
          profile: list[Path] = typer.Option([], "--profile", metavar="PROFILE",
                                             help="a profile to check instead of a suite, "
                                                  "repeatable"),
          config: str = typer.Option(None, "--config", metavar="NAME",
                                     help="where the kernels' config starts: debian (the "
                                          "default: Debian's config of the base's release), "
                                          "debian-generic, or tiny (tinyconfig, the fastest "
                                          "build)"),
          results: str = RESULTS,
          machines: str = typer.Option(None, "--machines", metavar="NAME,NAME",
                                       help="spread the first looks and confirmations over "
                                            "these fleet machines, one experiment per machine "
                                            "at a time; needs a postgresql:// store and "
                                            "workers on this machine or reading its kernel "
                                            "cache, shared (the built kernels are there)"),
          output: Path = typer.Option(None, "--output", "-o", metavar="DIR",
                                      help="also write report.txt, report.json and "
                                           "report.html there, and each change's evidence "
                                           "(its confirmation's report and bundle)"),
          as_json: bool = JSON) -> None:
    """Build BASE and BASE with the series (each patch an incremental build
    of the kept base tree), measure every profile on both in QEMU guests on
    counts, confirm each changed path with fresh rounds, explain it by
    function and name the patch that brought it; print the report in the
    kernel test robot's form.  Exit status 0: no change; 1: a change; 2:
    bad input or a failure.

    Example: mmlab check experiments/patches/seed003-zap-set-referenced-6.12.patch
    --base debian-source:6.12 --profile experiments/suites/unmap-young-shmem.toml"""
    from mmlab.check import request as requests
    from mmlab.check import session
    from mmlab.cli.display import Display
    from mmlab.cli.kernels import build_status
    from mmlab.errors import MmlabError
    from mmlab.fleet import machine_names
    from mmlab.kernels import kbuild
    from mmlab.report import json as report_json
    from mmlab.report import robot
    from mmlab.run import driver
    from mmlab.store import Store
    from mmlab.targets import TargetPool
    if output is not None and output.exists() and not output.is_dir():
        raise MmlabError(f"-o {output}: exists and is not a directory")
    names = machine_names(machines) if machines is not None else None
    show = Display(stderr=True)
    with tempfile.TemporaryDirectory(prefix="mmlab-check-") as scratch:
        asked, commit = _asked(patches or [], tree, commits, base, suite, profile, config,
                               Path(scratch))
        store, spread = _fleet(results, names, show) if names else (None, None)
        spec = str(kbuild.checkout(Path(asked.base), commit)) if commit else asked.base
        with build_status(spec) as on_line:
            files = requests.patch_files(asked, Path(scratch))
            kernels = kbuild.build_series(spec, files, [], None, on_line, every=len(files) > 1,
                                          config=asked.config)
    with show:
        store = store or Store(results)
        result = session.run(store, asked, kernels,
                             driver.Here(TargetPool(False, show.say)), results, show, spread)
    report = report_json.check(result) if as_json else robot.text(result)
    typer.echo(report, nl=False)
    if output is not None:
        _write(output, result, store)
    for f in result.failed:
        typer.echo(f"mmlab: failed: {f.profile} on {f.kernel}: {f.trials} trial(s): {f.error}",
                   err=True)
    if result.failed:
        typer.echo(f"mmlab: {sum(f.trials for f in result.failed)} trial(s) failed: the check "
                   f"is incomplete; exit status {FAILED}", err=True)
        raise typer.Exit(FAILED)
    if result.changed:
        raise typer.Exit(CHANGED)


def _asked(patches: list[Path], tree: Path | None, commits: str | None, base: str | None,
           suite: Path | None, profiles: list[Path], config: str | None,
           scratch: Path) -> tuple[Request, str | None]:
    """The request from files and --base, or from a tree's commits (written
    out as format-patch files into `scratch`) with the tree at OLD as the
    base; and that base's commit (None for files).  Without --config, the
    builds' default (kconfig.DEFAULT), which this command does not repeat."""
    from mmlab.check import request as requests
    from mmlab.errors import MmlabError
    from mmlab.kernels import kconfig
    config = config or kconfig.DEFAULT
    if tree is None and commits is None:
        return requests.read(patches, base, suite, profiles, config=config), None
    if tree is None or commits is None or patches or base:
        raise MmlabError("check: --tree DIR --commits OLD..NEW go together, without PATCH "
                         "files or --base (the base is the tree at OLD)")
    tree = tree.resolve()
    files, commit = requests.from_commits(tree, commits, scratch, config)
    return requests.read(files, str(tree), suite, profiles,
                         f"--tree {tree} --commits {commits}", config), commit


def _fleet(results: str, names: list[str], on_event: OnEvent) -> tuple[Store, Fleet]:
    """The fleet's shared store and the check's experiments spread over
    `names` (the tracker's spread.Fleet), refused before anything is
    built: a lab directory, a machine no worker registered, or one whose
    worker runs on another host and reads another kernel cache (or has not
    said which), so cannot boot the kernels the check builds into this
    process's cache.  A worker elsewhere that reads this very cache (a
    shared folder: the identity it registered is this cache's) boots them."""
    from mmlab.errors import MmlabError
    from mmlab.fleet import registry, worker
    from mmlab.machine import paths
    from mmlab.store import Store, backend
    from mmlab.track import spread
    if not backend.is_url(results):
        raise MmlabError(f"--machines needs the fleet's shared store: --results "
                         f"postgresql://... (not {results})")
    mine, cache = paths.kernel_cache_id(make=False), paths.kernel_cache()
    store = Store(results)
    run = spread.fleet_runner(store, results, names, False, on_event)
    for machine in registry.lookup(store, names).values():
        if machine.node != worker.node(machine.name) and not machine.reads_cache(mine):
            raise MmlabError(f"--machines {machine.name}: its worker ({machine.node}) is not "
                             f"on this machine and {machine.which_cache()}, not this "
                             f"check's ({cache}), where the kernels it builds go: start both "
                             "with MMLAB_KERNEL_CACHE naming one folder they share (an NFS "
                             f"mount), or the worker here (as {worker.node(machine.name)})")
    return store, spread.Fleet(store, names, run)


def _write(output: Path, result: CheckResult, store: Store) -> None:
    """The report in every form into `output`, with each change's evidence."""
    from mmlab.report import dashboard, robot, robot_html
    from mmlab.report import json as report_json
    output.mkdir(parents=True, exist_ok=True)
    bundled = dashboard.write_evidence(store, output,
                                       [f.evidence for f in result.found])
    for name, text in (("report.txt", robot.text(result)),
                       ("report.json", report_json.check(result)),
                       ("report.html", robot_html.render(result, bundled))):
        (output / name).write_text(text)
    typer.echo(f"wrote {output}/report.txt, report.json, report.html"
               + (f" and the evidence of {len(bundled)} confirmation(s)" if bundled else ""),
               err=True)
