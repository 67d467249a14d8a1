"""`mmlab kernels add|available|list|build`, `mmlab ab` and `mmlab narrow`:
kernels for guests, patch A/B and the search for the step that changed a
metric."""

from __future__ import annotations

import hashlib
import re
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from mmlab.cli import options
from mmlab.cli.options import ALLOW, ATTRIBUTE, JSON, PROFILE, RESULTS
from mmlab.errors import MmlabError

if TYPE_CHECKING:
    from mmlab.run.events import Created

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                  help="Kernel images for QEMU guests.")

KERNEL_SPEC = typer.Argument(..., metavar="KERNEL",
                             help="debian:6.12, debian:7.3.4, debian:6.12-generic, a range "
                                  "debian:6.12..debian:7.3, or a bzImage path")
SOURCE = typer.Option("debian-source:6.12", "--source", metavar="SOURCE",
                      help="debian-source:SERIES (Debian's linux-source package) or a kernel "
                           "tree")
CONFIG = typer.Option(None, "--config", metavar="NAME",
                      help="where the config starts: debian (the default: Debian's config of "
                           "that release, its cloud image's), debian-generic, or tiny "
                           "(tinyconfig, the fastest build); what the guest needs is built in "
                           "either way")
FRAGMENT = typer.Option([], "--fragment", metavar="FRAGMENT",
                        help="a config fragment (CONFIG_X=y lines) applied last, repeatable")


def _config(name: str | None) -> str:
    """The config a build starts from: the one asked for, else the builds'
    own default (kconfig.DEFAULT), which the options do not repeat."""
    from mmlab.kernels import kconfig
    return name or kconfig.DEFAULT


@app.command("add")
def add(spec: str = KERNEL_SPEC,
        config: Path = typer.Option(None, "--config", metavar="PATH",
                                    help="the .config of a local image"),
        name: str = typer.Option(None, "--name", metavar="NAME",
                                 help="name for a local image (local:NAME)")) -> None:
    """Fetch a Debian kernel from the catalog of every suite (apt, nothing
    installed) or register a local bzImage.

    Example: mmlab kernels add debian:6.12"""
    from mmlab.kernels import images, specs
    if spec.startswith("debian:"):
        found = [images.add_debian(one.removeprefix("debian:"))
                 for one in specs.expand([spec])]
    elif config is None:
        raise MmlabError(f"{spec}: a local image needs --config path/to/.config")
    else:
        found = [images.add_local(Path(spec), config, name)]
    for k in found:
        typer.echo(f"{k.name}: {k.identity()} from {k.source}, config sha256 "
                   f"{k.config_sha256[:12]}, {len(k.modules)} guest modules, in {k.dir}")


@app.command("available")
def available(series: str = typer.Argument(None, metavar="SERIES",
                                           help="a release series (6.12): every version in it"),
              refresh: bool = typer.Option(False, "--refresh",
                                           help="read the package lists again now"),
              as_json: bool = JSON) -> None:
    """What the Debian catalog can fetch: each release series with its newest
    patch level, flavour, suite and packaging (or every version of SERIES).

    Example: mmlab kernels available 6.12"""
    from mmlab.kernels import catalog
    from mmlab.report import json as report_json
    from mmlab.report import terminal
    from mmlab.report.terminal import kernels as kernel_tables
    if series and not re.fullmatch(r"\d+\.\d+", series):
        raise MmlabError(f"{series}: expected a release series like 6.12")
    apt = catalog.Apt()
    apt.refresh(force=refresh)
    rows = catalog.catalog_rows(apt, series)
    if as_json:
        typer.echo(report_json.records(rows))
        return
    terminal.console().print(kernel_tables.catalog_table(rows, every_version=bool(series)))
    typer.echo(f"suites read: {', '.join(apt.served())}", err=True)


@app.command("list")
def cached(as_json: bool = JSON) -> None:
    """The cached kernels and the features their configs enable.

    Example: mmlab kernels list --json"""
    from mmlab.kernels import images
    from mmlab.report import json as report_json
    from mmlab.report import terminal
    from mmlab.report.terminal import kernels as kernel_tables
    found = images.cached()
    if as_json:
        typer.echo(report_json.kernels(found))
        return
    terminal.console().print(kernel_tables.kernels_table(found))


@app.command("build")
def build(source: str = typer.Argument(..., metavar="SOURCE",
                                       help="debian-source:6.12 or a kernel tree"),
          patch: list[Path] = typer.Option([], "--patch", metavar="PATCH",
                                           help="a patch (-p1), repeatable"),
          config: str | None = CONFIG, fragment: list[Path] = FRAGMENT,
          name: str = typer.Option(None, "--name", metavar="NAME",
                                   help="name it build:NAME")) -> None:
    """Build a kernel for guests from source, cached by its inputs.

    Example: mmlab kernels build debian-source:6.12 --patch fix.patch"""
    from mmlab.kernels import kbuild
    with build_status(source) as on_line:
        k = kbuild.build(source, patch, fragment, name, on_line, _config(config))
    typer.echo(f"{k.name}: {k.version} ({k.source}), config {k.details['config']}, sha256 "
               f"{k.config_sha256[:12]}, build key {k.details['build_key'][:12]}")


@contextmanager
def build_status(source: str):
    """A live line while kernels build: the step count and the last line."""
    from rich.status import Status

    from mmlab.report import terminal
    count = 0
    with Status(f"building {source}", console=terminal.console()) as status:
        def on_line(line: str) -> None:
            nonlocal count
            count += 1
            status.update(terminal.escape(f"building {source}: {count} steps, "
                                          f"{line.strip()[:70]}"))
        yield on_line


def ab(profile: Path = PROFILE,
       patch: list[Path] = typer.Option(..., "--patch", metavar="PATCH",
                                        help="the change under test (B), repeatable"),
       source: str = SOURCE, config: str | None = CONFIG, fragment: list[Path] = FRAGMENT,
       results: str = RESULTS,
       allow_host_changes: bool = ALLOW, attribute: bool = ATTRIBUTE) -> None:
    """Patch A/B: build A (unpatched) and B (patched) from the same source and
    config, run PROFILE on both interleaved in QEMU, and judge B against A.

    Example: mmlab ab experiments/ksm-rmap-ab.toml --patch
    experiments/patches/seed004-ksm-rmap-walk-range-6.12.patch"""
    plan = options.load_profile(profile)
    from mmlab.cli.display import run_and_print
    from mmlab.experiment import plan as experiment_plan
    from mmlab.kernels import kbuild
    from mmlab.run import driver
    with build_status(source) as on_line:
        a, b = kbuild.ab_pair(source, patch, fragment, on_line, _config(config))
    sums = ", ".join(f"{p.name} sha256 {hashlib.sha256(p.read_bytes()).hexdigest()[:16]}"
                     for p in patch)

    def created(event: Created) -> None:
        typer.echo(f"A = {a.name} ({a.source}); B = {b.name} ({b.source}); experiment "
                   f"{event.ids[0]}", err=True)
    run_and_print(results, experiment_plan.with_kernels(plan, [a.name, b.name],
                                                        f"A/B of {sums}"),
                  None, allow_host_changes, driver.Options(attribute=attribute), created)


def narrow(profile: Path = typer.Argument(..., metavar="PROFILE",
                                          help="a [matrix] profile; its kernel axis is replaced"),
           kernel_list: str = typer.Option(None, "--kernels", metavar="K1,K2,...",
                                           help="kernels, put in order by version; a release "
                                                "range debian:6.12..debian:7.3 is one kernel per "
                                                "release series"),
           source: Path = typer.Option(None, "--source", metavar="TREE",
                                       help="a kernel git tree (with --commits)"),
           commit_range: str = typer.Option(None, "--commits", metavar="OLD..NEW",
                                            help="build and narrow commit by commit"),
           config: str | None = CONFIG, fragment: list[Path] = FRAGMENT,
           metric: str = typer.Option(None, "--metric", metavar="METRIC",
                                      help="default: the profile's first"),
           results: str = RESULTS, allow_host_changes: bool = ALLOW) -> None:
    """Find the first step in K1..Kn (or in the commits OLD..NEW of a git tree)
    where METRIC changes, by binary search, each step a real two-kernel
    experiment judged like any other.

    Example: mmlab narrow experiments/seed004-ksm-rmap-narrow.toml
    --kernels debian:6.12..debian:7.3"""
    plan = options.load_profile(profile)
    from mmlab.cli.display import Display
    from mmlab.kernels import kbuild, specs
    from mmlab.run import driver
    from mmlab.run import narrow as narrowing
    from mmlab.store import Store
    from mmlab.targets import TargetPool
    if plan.warnings():
        raise MmlabError(plan.warnings()[0])
    metric = metric or plan.profile.metrics[0]
    plan.workload.metric(metric)
    if bool(kernel_list) == bool(source and commit_range):
        raise MmlabError("narrow takes either --kernels K1,...,Kn or --source TREE --commits A..B")
    if kernel_list:
        given = specs.expand([k.strip() for k in kernel_list.split(",") if k.strip()])
        names = narrowing.ordered(given, lambda line: typer.echo(line, err=True))
        ensure = lambda name: None  # noqa: E731  (released kernels: fetched by their target)
    else:
        names, build_commit = kbuild.commit_kernels(source, commit_range, fragment,
                                                    _config(config))

        def ensure(name: str) -> None:
            with build_status(name) as on_line:
                build_commit(name, on_line)
    show = Display()
    with show:
        result = narrowing.search(Store(results), plan, names, metric,
                                  driver.Here(TargetPool(allow_host_changes, show.say)), ensure,
                                  show)
    for line in result.lines(names, metric):
        show.say(line)
