"""`mmlab census`: how many VMAs share one anon_vma, per process."""

from __future__ import annotations

from pathlib import Path

import typer

from mmlab.cli.options import ALLOW, JSON
from mmlab.errors import MmlabError

CMD = typer.Argument(None, metavar="[-- CMD ARGS...]",
                     help="a command to start and sample while it runs")
PID = typer.Option([], "--pid", metavar="PID", help="a process to census (repeatable)")
EVERY = typer.Option(False, "--all", help="every process on this machine")
RECIPE = typer.Option(None, "--recipe", metavar="RECIPE",
                      help="a census recipe (experiments/census/*.toml)")
TOP = typer.Option(5, "--top", min=1, metavar="N",
                   help="processes with a table, and groups per process")
INTERVAL = typer.Option(0.5, "--interval", min=0.01, metavar="SECONDS",
                        help="CMD: seconds between moments")
KERNEL = typer.Option("host", "--kernel", metavar="KERNEL",
                      help="CMD or RECIPE: run it in a QEMU guest on this kernel "
                           "(debian:6.12, debian:7.3)")
MEMORY = typer.Option(None, "--memory-mb", min=256, metavar="N",
                      help="with --kernel: guest memory in MiB (default: the recipe's, or 1024)")


def census(cmd: list[str] = CMD, pid: list[int] = PID, every: bool = EVERY,
           recipe_path: Path = RECIPE, top: int = TOP, interval_s: float = INTERVAL,
           kernel: str = KERNEL, memory_mb: int | None = MEMORY,
           allow_host_changes: bool = ALLOW, as_json: bool = JSON) -> None:
    """Count the VMAs sharing each anon_vma, grouped by root anon_vma, largest
    first: of PIDs, of every process, or of a command sampled while it runs
    and reported at its peak.  Read from the kernel with a BPF task_vma
    iterator (needs root and BTF); see docs/census.md.

    \b
    Examples:
      mmlab census --pid 1234
      mmlab census --all --top 10
      mmlab census -- java -XX:+UseZGC -Xmx512m -jar app.jar
      mmlab census --kernel debian:6.12 -- ./splitter 1001 guard 2
      mmlab census --recipe experiments/census/jvm-g1.toml --json
      mmlab census --recipe experiments/census/node-jit.toml --kernel debian:7.3"""
    chosen = [bool(cmd), bool(pid), every, recipe_path is not None]
    if sum(chosen) != 1:
        raise MmlabError("mmlab census: give one of --pid PID, --all, --recipe RECIPE or "
                         "-- CMD ARGS")
    if kernel != "host" and not (cmd or recipe_path):
        raise MmlabError("mmlab census: --kernel goes with -- CMD ARGS or --recipe RECIPE "
                         "(a guest runs the command)")
    if memory_mb is not None and kernel == "host":
        raise MmlabError("mmlab census: --memory-mb goes with --kernel (it sizes the guest)")
    from mmlab.census import command, guest, recipe, take
    from mmlab.report import terminal
    from mmlab.report.terminal import census as census_tables
    out = terminal.console()
    if pid or every:
        found = take.take(pid or None, top)
        if as_json:
            typer.echo(found.model_dump_json(indent=1))
        else:
            census_tables.print_census(out, found)
        return
    if recipe_path:
        ran = recipe.survey(recipe_path, top, allow_host_changes, kernel, memory_mb)
    elif kernel != "host":
        ran = guest.survey(kernel, cmd, interval_s, top, memory_mb=memory_mb or 1024)
    else:
        ran = command.survey(cmd, interval_s, top)
    if as_json:
        typer.echo(ran.model_dump_json(indent=1))
    else:
        census_tables.print_command(out, ran)
