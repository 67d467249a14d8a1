"""`mmlab bare-metal stage|check`: a real machine's library staged for its
disk and boot loader, and its agent asked what it is and what it holds."""

from __future__ import annotations

from pathlib import Path

import typer

from mmlab.errors import MmlabError

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                  help="Real bare-metal machines: stage their library, check their agent.")

MACHINE_FILE = typer.Argument(..., metavar="MACHINE.toml", help="the machine file")
KERNELS = typer.Option(..., "--kernels", metavar="K1,K2",
                       help="the kernels under test the library holds (debian:6.12,debian:7.3)")


def _kernels(names: str) -> list:
    """Each named kernel, fetched now if it must be; one that cannot be is refused."""
    from mmlab.experiment.profile import KERNEL_NAME
    from mmlab.kernels import images
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if not wanted:
        raise MmlabError("--kernels: name at least one kernel (debian:7.3, say)")
    out = []
    for name in wanted:
        if not KERNEL_NAME.match(name) or name == "host":
            raise MmlabError(f"--kernels: {name!r} is not a kernel mmlab fetches or builds")
        got = images.ready(name, typer.echo)
        if isinstance(got, MmlabError):
            raise got
        out.append(got)
    return out


@app.command("stage")
def stage(machine_file: Path = MACHINE_FILE, kernels: str = KERNELS,
          output: Path = typer.Option(..., "--output", metavar="DIR",
                                      help="where library.img and the boot files go")) -> None:
    """Write the machine's library (library.img, for the disk or partition
    its machine file's `disk` finds) and the base kernel with the agent's
    initramfs and command line (base.vmlinuz, base.initrd, base.append, for
    its boot loader).  Stage again after mmlab changes: a start refuses a
    library another mmlab staged.

    Example: mmlab bare-metal stage box1.toml --kernels debian:6.12,debian:7.3 --output box1"""
    from mmlab.targets import realmachine
    machine = realmachine.load(machine_file)
    if output.exists() and not output.is_dir():
        raise MmlabError(f"--output {output}: not a directory")
    realmachine.base_kernel(machine, typer.echo)     # refused before a kernel is fetched
    found = _kernels(kernels)
    image = realmachine.stage(machine, found, output, typer.echo)
    size_mib = -(-image.stat().st_size // (1 << 20))
    typer.echo(f"{machine.name}: {len(found)} kernel(s) and its base {machine.base} staged in "
               f"{output}")
    typer.echo(f"  the library: dd if={image} of=DISK bs=1M conv=fsync (DISK: a disk or "
               f"partition of at least {size_mib} MiB that `disk = {machine.wiring.disk!r}` "
               "finds; it is overwritten)")
    typer.echo(f"  the boot loader: kernel {output / 'base.vmlinuz'}, initrd "
               f"{output / 'base.initrd'}, command line {(output / 'base.append').read_text()}")


@app.command("check")
def check(machine_file: Path = MACHINE_FILE, kernels: str = KERNELS) -> None:
    """Ask the machine's agent what the machine is and whether its library
    holds `--kernels` as this mmlab stages them (power cycling it, with its
    machine file's command, if the agent does not answer).

    Example: mmlab bare-metal check box1.toml --kernels debian:6.12,debian:7.3"""
    from mmlab.targets import realmachine
    machine = realmachine.RealMachine(realmachine.load(machine_file), typer.echo)
    found = _kernels(kernels)
    try:
        _, entries = machine.start(found)
        facts = machine.environment()
    finally:
        machine.stop()
    typer.echo(f"{machine.name}: {facts['cpus']} CPUs ({facts['cpu_model']}), "
               f"{facts['memory_kb']} kB, its agent on {facts['kernel']}")
    for name, entry in entries.items():
        typer.echo(f"  {name}: staged as {entry}, current")
