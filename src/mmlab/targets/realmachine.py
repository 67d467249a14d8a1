"""A real bare-metal machine, as a machine file describes it: the agent
(kexec.py) runs on its base kernel, started by its own boot loader from the
files `mmlab bare-metal stage` writes; the coordinator reaches the agent
over a serial line; the kernels under test wait in a library the user
wrote to one of its disks or partitions; and a command of the user's (a
BMC's ipmitool, a switched PDU, a relay) power cycles it when a trial
leaves it hung or amid a kernel.

Nothing here copies a kernel over the serial line (a kernel and its
initramfs at 115200 baud would take minutes): the library is staged once
per set of kernels, and every start asks the agent what its library holds
and refuses a kernel it lacks, or holds as another mmlab staged it, in one
line that says how to stage it again.

A machine file:

    name = "box1"                     # what its samples say they ran on
    base = "debian:6.12"              # the kernel its boot loader starts the agent on
    serial = "/dev/ttyUSB0"           # the coordinator's end of the agent's line
    baud = 115200
    channel = "/dev/ttyS1"            # the machine's end of that line
    console = "ttyS0,115200n8"        # its kernels' console (their command line)
    disk = "/dev/sd*"                 # where the agent looks for the library
    modules = ["ahci", "sd_mod"]      # modules its kernels load first: the disk's driver...
    power_cycle = "ipmitool -I lanplus -H box1-bmc -U admin -E chassis power cycle"
    console_log = "/var/log/conserver/box1.log"   # optional: its console, logged
    back = "kexec"                    # or "reboot": back through the boot loader
    boot_timeout_s = 300              # a power cycle until the agent answers
    power_timeout_s = 120             # the power_cycle command, until it is killed

A serial line that cannot be opened is a typo or the cabling, refused in
one line naming it; only a line that opens with no agent answering on it
is a reason to power cycle the machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import termios
import time
import tomllib
import tty
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from mmlab.errors import MmlabError
from mmlab.experiment.profile import KERNEL_NAME
from mmlab.judge.measurements import BARE_METAL
from mmlab.kernels import images
from mmlab.machine import paths
from mmlab.names import safe_name
from mmlab.targets import kexec, probe
from mmlab.targets.agentlink import Heard, Link, MachineGone, Stream
from mmlab.targets.boot import KERNEL_ARGS, failure, initramfs_cache, read_text

HELLO_S = 10            # an agent that waits answers a hello at once
HELLO_EVERY_S = 5       # a hello said again while a machine boots (a line drops what no one reads)
# What goes into the machine's shell scripts as it is: device paths, with a
# pattern's wildcards, and nothing a shell would read more into.
DEVICE = re.compile(r"/dev/[\w./*?\[\]-]+")
SPEEDS = {int(name[1:]): getattr(termios, name) for name in dir(termios)
          if name[0] == "B" and name[1:].isdigit()}


@dataclass(frozen=True)
class MachineFile:
    """A real machine, as its machine file describes it."""
    path: Path
    name: str
    base: str
    serial: str
    wiring: kexec.Wiring
    console: str = "ttyS0,115200n8"
    power_cycle: str = ""
    console_log: str = ""
    boot_timeout_s: float = 300.0
    power_timeout_s: float = 120.0

    @property
    def cmdline(self) -> str:
        """What every kernel on it is told: its console, then mmlab's arguments."""
        return f"console={self.console} {KERNEL_ARGS}"


KEYS: dict[str, tuple[type, ...]] = {
    "name": (str,), "base": (str,), "serial": (str,), "baud": (int,), "channel": (str,),
    "console": (str,), "disk": (str,), "modules": (list,), "power_cycle": (str,),
    "console_log": (str,), "back": (str,), "boot_timeout_s": (int, float),
    "power_timeout_s": (int, float)}
REQUIRED = ("name", "base", "serial", "channel", "disk")


def is_file(spec: str) -> bool:
    """Whether $MMLAB_BARE_METAL (or --bare-metal) names a machine file."""
    return spec.endswith(".toml")


def load(path: Path) -> MachineFile:
    """The machine file at `path`; anything wrong in it refused in one line
    naming the file and the key."""
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise MmlabError(f"{path}: cannot read the machine file ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise MmlabError(f"{path}: not a text file (a machine file is TOML)") from exc
    except tomllib.TOMLDecodeError as exc:
        raise MmlabError(f"{path}: not TOML ({exc})") from exc
    for key, value in raw.items():
        if key not in KEYS:
            raise MmlabError(f"{path}: unknown key {key!r} (a machine file knows "
                             f"{', '.join(KEYS)})")
        if not isinstance(value, KEYS[key]) or isinstance(value, bool):
            raise MmlabError(f"{path}: {key} = {value!r}: expected "
                             f"{' or '.join(t.__name__ for t in KEYS[key])}")
    for key in REQUIRED:
        if not raw.get(key):
            raise MmlabError(f"{path}: {key} is missing (a machine file needs "
                             f"{', '.join(REQUIRED)})")
    checks = [
        ("name", safe_name(raw["name"]) == raw["name"], "letters, digits, '.', '-' or '_'"),
        ("base", bool(KERNEL_NAME.match(raw["base"])) and raw["base"] != "host",
         "a kernel mmlab fetches or builds (debian:6.12, say)"),
        ("baud", raw.get("baud", 115200) in SPEEDS, "a serial line's speed (115200, say)"),
        ("back", raw.get("back", "kexec") in kexec.BACK, " or ".join(kexec.BACK)),
        ("boot_timeout_s", raw.get("boot_timeout_s", 300) > 0, "seconds, more than 0"),
        ("power_timeout_s", raw.get("power_timeout_s", 120) > 0, "seconds, more than 0"),
        ("modules", all(re.fullmatch(r"[\w-]+", m) for m in raw.get("modules", [])),
         "module names"),
        ("channel", bool(DEVICE.fullmatch(raw["channel"])), "a device under /dev"),
        ("disk", bool(DEVICE.fullmatch(raw["disk"])),
         "a device under /dev, or a shell pattern of them"),
        ("console", bool(re.fullmatch(r"[\w,.-]+", raw.get("console", "tty0"))),
         "a console= value (ttyS0,115200n8, say)"),
    ]
    for key, ok, wanted in checks:
        if not ok:
            raise MmlabError(f"{path}: {key} = {raw[key]!r}: expected {wanted}")
    wiring = kexec.Wiring(channel=raw["channel"], disk=raw["disk"],
                          modules=tuple(raw.get("modules", ())),
                          baud=raw.get("baud", 115200), back=raw.get("back", "kexec"))
    return MachineFile(path=path, name=raw["name"], base=raw["base"], serial=raw["serial"],
                       wiring=wiring, console=raw.get("console", "ttyS0,115200n8"),
                       power_cycle=raw.get("power_cycle", ""),
                       console_log=raw.get("console_log", ""),
                       boot_timeout_s=float(raw.get("boot_timeout_s", 300)),
                       power_timeout_s=float(raw.get("power_timeout_s", 120)))


def base_kernel(machine: MachineFile, say: Callable[[str], None]) -> images.Kernel:
    """The machine's base kernel, fetched now if it must be."""
    got = images.ready(machine.base, say)
    if isinstance(got, MmlabError):
        raise MmlabError(f"{machine.path}: base = {machine.base!r}: {got}")
    return got


def library(machine: MachineFile, kernels: Sequence[images.Kernel], tmp: Path,
            say: Callable[[str], None]) -> dict[str, Path | bytes]:
    """The library this mmlab would stage for `machine` with `kernels`."""
    return kexec.library(base_kernel(machine, say), machine.cmdline, kernels, machine.wiring,
                         initramfs_cache(), tmp, say)


def stage(machine: MachineFile, kernels: Sequence[images.Kernel], dest: Path,
          say: Callable[[str], None]) -> Path:
    """Write `dest`/library.img (for the machine's library disk) and the base
    kernel, its initramfs and its command line (for its boot loader);
    `dest` made only once the library is (a base kernel that cannot be
    had leaves nothing)."""
    with tempfile.TemporaryDirectory(prefix="mmlab-stage-") as tmp:
        files = library(machine, kernels, Path(tmp), say)
        dest.mkdir(parents=True, exist_ok=True)
        image = kexec.disk(dest / "library.img", files, machine.name)
        for name in ("base.vmlinuz", "base.initrd", "base.append"):
            content = files[name]
            if isinstance(content, bytes):
                (dest / name).write_bytes(content)
            else:
                shutil.copyfile(content, dest / name)
    return image


class RealMachine:
    """A machine file's machine, driven through its serial line and its
    power_cycle command (baremetal.Machine)."""

    accelerator = BARE_METAL

    def __init__(self, machine: MachineFile, say: Callable[[str], None] = print):
        self.file = machine
        self.name = machine.name
        self.say = say
        self.cmdline = machine.cmdline
        self.why = (f"kexec'd on {machine.name}, whose agent runs on {machine.base} "
                    f"(machine file {machine.path})")
        self.link: Link | None = None
        self.held: IO[str] | None = None     # the machine's lock while its line is open
        self.facts: dict[str, object] = {}
        self.wanted: dict[tuple, dict[str, tuple[str, str]]] = {}   # by kernel set
        self.log_from = 0
        self.booting = False     # power cycled: its agent answers once it has booted
        self._line_there()

    def base(self) -> images.Kernel:
        return base_kernel(self.file, self.say)

    def start(self, kernels: Sequence[images.Kernel]) -> tuple[Link, dict[str, str]]:
        """The agent answering, and each kernel's entry in the machine's
        library; a kernel the library lacks, or holds as staged by another
        mmlab, refused in one line that says how to stage it again."""
        self.stop()
        if not self.booting:
            self._line_there()
        wanted = self._wanted(kernels)
        self._take()
        try:
            return self._answered(kernels, wanted)
        except BaseException:
            self.stop()
            raise

    def _wanted(self, kernels: Sequence[images.Kernel]) -> dict[str, tuple[str, str]]:
        """What the library should hold for `kernels`, as this mmlab would
        stage it: worked out once per set of kernels (building the
        initramfs parts and hashing them), not at every start."""
        key = tuple((k.name, k.version, k.package_version, k.config_sha256) for k in kernels)
        if key not in self.wanted:
            with tempfile.TemporaryDirectory(prefix="mmlab-library-") as tmp:
                self.wanted[key] = kexec.held(library(self.file, kernels, Path(tmp), self.say))
        return self.wanted[key]

    def _line_there(self) -> None:
        """The serial device there, a character device, checked before
        anything is built, stored or power cycled: one that is not is a typo
        or the cabling, which no power cycle mends."""
        try:
            there = stat.S_ISCHR(os.stat(self.file.serial).st_mode)
        except OSError as exc:
            raise self._no_line(exc.strerror or str(exc)) from exc
        if not there:
            raise self._no_line("not a character device")

    def _no_line(self, why: str) -> MmlabError:
        return MmlabError(f"{self.file.path}: serial = {self.file.serial!r}: cannot open the "
                          f"line ({why}); check the device's name and its cabling")

    def _answered(self, kernels: Sequence[images.Kernel],
                  wanted: dict[str, tuple[str, str]]) -> tuple[Link, dict[str, str]]:
        """The agent's answer, power cycling the machine if it gives none,
        checked against the library this mmlab would stage."""
        self.log_from = self._log_size()
        answer = self._hello(time.monotonic() + (self.file.boot_timeout_s if self.booting
                                                 else HELLO_S))
        if answer is None:
            self.power_cycle("its agent did not answer")
            answer = self._hello(time.monotonic() + self.file.boot_timeout_s)
        if answer is None:
            raise MmlabError(f"{self.name}: no answer from its agent on {self.file.serial} "
                             f"within boot_timeout_s = {self.file.boot_timeout_s:g} after a "
                             "power cycle")
        self.booting = False
        held = kexec.read([list(h.args) for h in answer[1:]])
        stale = [f"its base kernel {self.file.base}" if name == "base" else name
                 for name, (_, digest) in wanted.items() if held.get(name, ("", ""))[1] != digest]
        if stale:
            boot = " with its boot loader's files" if "base" in stale[0] else ""
            raise MmlabError(
                f"{self.name}: its library lacks {', '.join(stale)} as this mmlab stages "
                f"them; stage it again (mmlab bare-metal stage {self.file.path} --kernels "
                f"{','.join(k.name for k in kernels)}) and write it to the machine{boot}")
        self._facts(answer[0])
        assert self.link is not None
        return self.link, {k.name: held[k.name][0] for k in kernels}

    def _hello(self, deadline: float) -> list[Heard] | None:
        """The agent's answer to a hello (its MMLAB-MACHINE line, then one
        MMLAB-ENTRY per kernel of its library), said again every few seconds
        while no answer comes; None at the deadline, the line closed.  A
        line that cannot be opened yet (a USB adapter coming back after the
        power cycle mmlab ran) is tried again each second; before one, it is
        refused in one line naming it, and no power cycle follows."""
        while (link := self._open()) is None:
            if time.monotonic() + 1 >= deadline:
                return None
            time.sleep(1)
        self.link = link
        answer: list[Heard] = []
        again = 0.0
        try:
            while time.monotonic() < deadline:
                if time.monotonic() >= again:
                    self.link.send(b"MMLAB-HELLO\n")
                    again = time.monotonic() + HELLO_EVERY_S
                heard = self.link.marker(min(deadline, again))
                if heard is None:
                    continue
                if heard.word == "MMLAB-MACHINE":
                    answer = [heard]
                elif heard.word == "MMLAB-ENTRY" and answer:
                    answer.append(heard)
                elif heard.word == "MMLAB-AGENT-READY" and answer:
                    return answer
        except (OSError, MachineGone):
            pass
        self.link.close()
        self.link = None
        return None

    def _take(self) -> None:
        """The machine to this process alone while its line is open: a
        second mmlab driving it waits, saying for whom, and the two take
        turns between batches."""
        path = paths.state_dir() / f"bare-metal-{self.name}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.held = open(path, "a+")     # noqa: SIM115 (held until stop() closes it)
        try:
            fcntl.flock(self.held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.held.seek(0)
            self.say(f"{self.name}: waiting for mmlab pid {self.held.read().strip() or '?'}, "
                     f"which drives it ({path})")
            fcntl.flock(self.held, fcntl.LOCK_EX)
        self.held.seek(0)
        self.held.truncate()
        self.held.write(f"{os.getpid()}\n")
        self.held.flush()

    def _open(self) -> Link | None:
        """The line opened; None while a power cycled machine's line is not
        back yet (a USB adapter re-enumerating)."""
        try:
            return Link(open_serial(self.file.serial, self.file.wiring.baud))
        except OSError as exc:
            if self.booting:
                return None
            raise self._no_line(exc.strerror or str(exc)) from exc

    def _facts(self, heard: Heard) -> None:
        """What the agent said the machine is, named as a host's environment
        names the host: its kernel (the base), CPUs, CPU model and memory."""
        cpus, memory_kb, release, *model = heard.args + ("",) * 3
        self.facts = {"kernel": release, "cpus": int(cpus) if cpus.isdigit() else cpus,
                      "cpu_model": " ".join(model).strip() or "not said",
                      "memory_kb": int(memory_kb) if memory_kb.isdigit() else memory_kb}

    def power_cycle(self, why: str) -> None:
        """The machine power cycled by the machine file's command, run in a
        process group of its own so that a command that hangs (a BMC that
        never answers) is killed whole at power_timeout_s, and nothing it
        started outlives it."""
        if not self.file.power_cycle:
            raise MmlabError(f"{self.name}: {why}, and {self.file.path} names no power_cycle "
                             "command: reset it by hand")
        self.say(f"{self.name}: power cycling it ({why})")
        limit = self.file.power_timeout_s
        with subprocess.Popen(self.file.power_cycle, shell=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True,
                              start_new_session=True) as done:
            try:
                _, err = done.communicate(timeout=limit)
            except subprocess.TimeoutExpired as exc:
                raise MmlabError(f"{self.name}: power_cycle did not end within "
                                 f"power_timeout_s = {limit:g} s; it and every process it "
                                 "started were killed") from exc
            finally:
                end_group(done.pid)
        if done.returncode != 0:
            last = (err.strip().splitlines() or ["no message"])[-1]
            raise MmlabError(f"{self.name}: power_cycle exited {done.returncode}: {last}")
        self.booting = True

    def console(self) -> str:
        """Its console since it started, where its machine file names a log of it."""
        if not self.file.console_log:
            return ""
        return read_text(Path(self.file.console_log))[self.log_from:]

    def _log_size(self) -> int:
        return len(read_text(Path(self.file.console_log))) if self.file.console_log else 0

    def failure(self, since: int) -> str:
        found = failure(self.console()[since:])
        return f"{found[0]}: {found[1]}" if found else ""

    def stop(self) -> None:
        """Let go of the line and the machine; one left amid a trial
        (anything but its agent waiting) is power cycled first, so the next
        start finds its agent."""
        heard = self.link.last if self.link else None
        if self.link:
            self.link.close()
            self.link = None
            if heard is None or heard.word != "MMLAB-AGENT-READY":
                try:
                    self.power_cycle("it was left amid a trial")
                except MmlabError as exc:
                    print(f"mmlab: {exc}", file=sys.stderr)
        if self.held:
            self.held.close()           # the lock goes with it
            self.held = None

    def environment(self) -> dict[str, object]:
        """The machine as its agent described it, and the coordinator's mmlab
        (every other key of a host's environment is the coordinator's host,
        so none is borrowed from it)."""
        host = probe.environment()
        base = self.base()
        return {"mmlab_version": host["mmlab_version"], "git_commit": host["git_commit"],
                "target": "bare-metal", "machine": self.name, "accelerator": self.accelerator,
                "accelerator_why": self.why, "base_kernel": base.name,
                "base_kernel_version": base.version, **self.facts}


def end_group(leader: int) -> None:
    """Every process left in the process group `leader` started (a power
    command's children): killed, so none outlives the command."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(leader, signal.SIGKILL)


def open_serial(path: str, baud: int | None) -> Stream:
    """The coordinator's end of the line: raw, at `baud`, no modem control."""
    fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
    try:
        tty.setraw(fd)
        attrs = termios.tcgetattr(fd)
        if baud:
            attrs[4] = attrs[5] = SPEEDS[baud]
        attrs[2] |= termios.CLOCAL
        termios.tcsetattr(fd, termios.TCSANOW, attrs)
        termios.tcflush(fd, termios.TCIFLUSH)
    except termios.error as exc:
        os.close(fd)
        raise OSError(exc.args[0], f"not a serial line ({exc.args[-1]})") from exc
    return os.fdopen(fd, "r+b", buffering=0)
