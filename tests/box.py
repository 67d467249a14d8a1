"""A QEMU guest wired as a real machine is, for testing the real machine's
link (realmachine.py) through the same three things a lab gives it: the
agent's serial line is a tty (QEMU's -serial pty, linked at DIR/tty; while
the box is off, a pty no one answers, as a USB adapter on the driving host
is there with no agent on it), the library is a disk (the staged
library.img, on an AHCI or virtio controller), and power control is a
command (DIR/power: the QEMU killed and started again, booting the staged
base files as a boot loader would; a reboot inside the guest boots them
again too).  Nothing of mmlab starts or reads it but through those."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from mmlab.targets.boot import QEMU

# The controller the library disk hangs on, and what a machine file says of it.
DISKS = {
    "ahci": (["-drive", "file=library.img,format=raw,if=none,id=lib", "-device", "ahci,id=ahci",
              "-device", "ide-hd,drive=lib,bus=ahci.0"], "/dev/sd*", ["ahci", "sd_mod"]),
    "virtio": (["-drive", "file=library.img,format=raw,if=virtio"], "/dev/vd*", ["virtio_blk"]),
}

POWER = """#!/bin/sh
# The box's power: off, or cycled (off, then on with its agent's line at ./tty)
cd {dir}
if [ -f qemu.pid ]; then
    pid=$(cat qemu.pid)
    kill "$pid" 2>/dev/null
    for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f qemu.pid
    ln -sfn /dev/ptmx tty
fi
[ "$1" = off ] && exit 0
out=$({qemu} 2>&1) || {{ echo "$out" >&2; exit 1; }}
pts=$(echo "$out" | sed -n 's|.*redirected to \\(/dev/pts/[0-9]*\\) (label agent).*|\\1|p')
[ -n "$pts" ] || {{ echo "no pty in: $out" >&2; exit 1; }}
ln -sfn "$pts" tty
"""


def wire(where: Path, disk: str = "virtio", base: str = "debian:6.12",
         back: str = "kexec", boot_timeout_s: float = 180) -> Path:
    """The box's power script and its machine file in `where` (its staged
    files go there too); the machine file's path."""
    args, pattern, modules = DISKS[disk]
    qemu = [QEMU, "-machine", "pc", "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "1",
            "-m", "1024", "-kernel", "base.vmlinuz", "-initrd", "base.initrd",
            "-display", "none", "-nodefaults", *args,
            "-chardev", "file,id=con,path=console.log,append=on", "-serial", "chardev:con",
            "-chardev", "pty,id=agent", "-serial", "chardev:agent",
            "-daemonize", "-pidfile", "qemu.pid"]
    line = " ".join(map(shlex.quote, qemu)) + ' -append "$(cat base.append)"'
    (where / "power").write_text(POWER.format(dir=shlex.quote(str(where)), qemu=line))
    (where / "power").chmod(0o755)
    (where / "tty").symlink_to("/dev/ptmx")         # off: a line, and no agent on it
    machine = where / "box.toml"
    machine.write_text(f"""name = "box"
base = "{base}"
serial = "{where / 'tty'}"
baud = 115200
channel = "/dev/ttyS1"
console = "ttyS0"
disk = "{pattern}"
modules = {modules!r}
power_cycle = "{where / 'power'}"
console_log = "{where / 'console.log'}"
back = "{back}"
boot_timeout_s = {boot_timeout_s}
""".replace("'", '"'))
    return machine


def off(where: Path) -> None:
    """The box powered off (a test's end)."""
    subprocess.run([str(where / "power"), "off"], check=False, timeout=30)
