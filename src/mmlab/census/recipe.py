"""A census recipe: a real program run as it really runs, in one TOML file,
so that one command reproduces its census.

    description = "PostgreSQL 15 under pgbench, 8 clients"
    prepare = [["initdb", "-D", "{work}/db"]]          # in order, before all
    [[services]]                                       # started, then polled
    command = ["postgres", "-D", "{work}/db", "-p", "{port}"]
    ready = ["pg_isready", "-p", "{port}"]
    setup = [["pgbench", "-i", "-p", "{port}"]]        # once the services are ready
    command = ["pgbench", "-c", "8", "-T", "30", "-p", "{port}"]   # sampled
    [settings]                                         # global settings (KSM)
    ksm = { run = 1 }
    [guest]                                            # with --kernel
    memory_mb = 2048
    root = "host"                                      # run it from the host's root

{here} is the recipe's folder (its program sources), {work} a private
folder removed afterwards, {port} a free loopback port.  The command and the
services' process trees are sampled; the services are killed at the end.
The whole recipe holds mmlab's machine lock: it loads the machine, and any
[settings] are journaled and restored however it ends.

With a kernel (survey(..., kernel="debian:6.12")) the command runs in a guest
of that kernel (guest.py) and [settings] are written inside the guest, so
they need no --allow-host-changes.  By default the prepare and setup steps
still run here (a compiler is not carried into a guest) and the command
travels in the initramfs with the files it names and the libraries they
load.  A program that loads more than ldd names (a JVM reads its JDK tree
at run time) or that has services (a database needs its users and data
folder) says `root = "host"`: then every step runs in the guest, in a
chroot of this machine's root mounted read-only (hostroot.py), with {work}
on the guest's own tmpfs.  Services without it are refused in one line
before anything runs.
"""

from __future__ import annotations

import math
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
import tomllib
from contextlib import ExitStack
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mmlab.census import command, guest
from mmlab.census.records import CommandCensus
from mmlab.errors import MmlabError
from mmlab.experiment import source
from mmlab.machine import knobs, proc
from mmlab.machine.knobs import HostSettings
from mmlab.targets import hostroot

READY_POLL_S = 0.5   # a guest's service readiness poll


class Service(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: list[str]
    ready: list[str] | None = None      # polled until it exits 0
    ready_timeout_s: float = 60


class InGuest(BaseModel):
    """How the recipe runs in a guest: memory_mb holds what the guest keeps
    in its memory (an initramfs with the program and its libraries, or the
    host root's files it reads) besides the program's own memory; `root`
    says where the program comes from (the initramfs, or the host's root)."""
    model_config = ConfigDict(extra="forbid")
    memory_mb: int = Field(1024, ge=256)
    root: Literal["initramfs", "host"] = "initramfs"


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str
    prepare: list[list[str]] = []
    services: list[Service] = []
    setup: list[list[str]] = []
    command: list[str] = Field(min_length=1)
    interval_s: float = Field(0.5, gt=0)
    timeout_s: float = Field(900, gt=0)
    settings: HostSettings = HostSettings()
    guest: InGuest = InGuest()


def load(path: Path) -> Recipe:
    """The recipe at `path`; a bad key or value is named in one line."""
    try:
        return Recipe.model_validate(tomllib.loads(source.read(path, "recipe")))
    except tomllib.TOMLDecodeError as exc:
        raise MmlabError(f"{path}: {exc}") from exc
    except ValidationError as exc:
        err = exc.errors()[0]
        raise MmlabError(f"{path}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from exc


def programs_found(path: Path, recipe: Recipe) -> None:
    """Every program the recipe starts is found on this machine before
    anything runs or is waited for (the machine lock, a guest's boot): a
    missing one is one line naming it.  A program under {work} is made by a
    step before it, so it is not looked for."""
    here = str(path.resolve().parent)
    for argv in (*recipe.prepare, *(s.command for s in recipe.services),
                 *(s.ready for s in recipe.services if s.ready), *recipe.setup, recipe.command):
        program = argv[0] if argv else ""
        if "{work}" not in program and not shutil.which(program.replace("{here}", here)):
            raise MmlabError(f"{path}: {program!r}: no such program on this machine")


def travels(path: Path, recipe: Recipe) -> None:
    """Refuse, in one line, a recipe whose program cannot run in a guest."""
    why = None
    if recipe.services and recipe.guest.root != "host":
        why = ("its services need their users and data folder, which a guest's initramfs "
               'does not have: give it [guest] root = "host"')
    if recipe.settings.swap is not None:
        why = "a census guest has no swap device"
    if recipe.settings.clock():
        why = "governor and turbo are the host's CPU clock, which a guest cannot set"
    if why:
        raise MmlabError(f"{path}: cannot run in a guest: {why}")


def survey(path: Path, top: int = 5, allowed: bool = False, kernel: str = "host",
           memory_mb: int | None = None) -> CommandCensus:
    """Run the recipe at `path` and return its command's census: here, or
    with `kernel` in a guest of it (`memory_mb`: the guest's memory, the
    recipe's by default)."""
    recipe = load(path)
    programs_found(path, recipe)
    if kernel != "host":
        travels(path, recipe)
        if recipe.guest.root == "host":
            return _in_host_root(path, recipe, top, kernel, memory_mb)
    work = Path(tempfile.mkdtemp(prefix="mmlab-census-"))
    work.chmod(0o755)       # a service may run as another user (postgres refuses root)
    names = {"here": str(path.resolve().parent), "work": str(work), "port": str(_free_port())}
    try:
        if kernel != "host":
            for argv in recipe.prepare + recipe.setup:
                _step(_fill(argv, names))
            return guest.survey(kernel, _fill(recipe.command, names), recipe.interval_s, top,
                             memory_mb=memory_mb or recipe.guest.memory_mb,
                             settings=recipe.settings, timeout_s=recipe.timeout_s)
        with knobs.Journal().session() as journal, ExitStack() as services:
            knobs.apply(recipe.settings, journal, allowed)
            for argv in recipe.prepare:
                _step(_fill(argv, names))
            pids = {_start(s, names, services) for s in recipe.services}
            for argv in recipe.setup:
                _step(_fill(argv, names))
            return command.survey(_fill(recipe.command, names), recipe.interval_s, top, also=pids,
                               timeout_s=recipe.timeout_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _in_host_root(path: Path, recipe: Recipe, top: int, kernel: str,
                  memory_mb: int | None) -> CommandCensus:
    """Every step and the command in a guest, in a chroot of this machine's
    root, {work} on the guest's tmpfs."""
    names = {"here": hostroot.HERE, "work": hostroot.WORK, "port": str(_free_port())}
    return guest.survey(kernel, _fill(recipe.command, names), recipe.interval_s, top,
                     memory_mb=memory_mb or recipe.guest.memory_mb, settings=recipe.settings,
                     timeout_s=recipe.timeout_s,
                     root=guest.HostRoot(path.resolve().parent, guest_steps(recipe, names)))


def guest_steps(recipe: Recipe, names: dict[str, str]) -> str:
    """The recipe's prepare, services and setup as one shell script for the
    guest: a failing step names itself on stderr and stops it; each service
    starts in the background, its PID in guest.SERVICES, and is polled
    until ready (the recipe's whole timeout: an emulated guest is slow)."""
    def step(argv: list[str]) -> str:
        shown = shlex.quote(" ".join(argv[:3]))
        return (f"{shlex.join(argv)} || {{ echo \"step failed (status $?): \"{shown} >&2; "
                "exit 1; }")
    lines = [step(_fill(a, names)) for a in recipe.prepare]
    polls = math.ceil(recipe.timeout_s / READY_POLL_S)
    for i, service in enumerate(recipe.services):
        argv = _fill(service.command, names)
        shown = shlex.quote(" ".join(argv[:3]))
        lines += [f"{shlex.join(argv)} < /dev/null > /tmp/mmlab-service-{i}.log 2>&1 &",
                  "svc=$!", f"echo $svc >> {guest.SERVICES}"]
        if service.ready:
            lines += ["n=0",
                      f"until {shlex.join(_fill(service.ready, names))} > /dev/null 2>&1; do",
                      f"  kill -0 $svc 2>/dev/null || {{ echo {shown}\": exited before it "
                      f"was ready: $(tail -1 /tmp/mmlab-service-{i}.log)\" >&2; exit 1; }}",
                      f"  n=$((n+1)); [ $n -lt {polls} ] || {{ echo {shown}\": not ready\" >&2; "
                      "exit 1; }",
                      f"  sleep {READY_POLL_S:g}", "done"]
    lines += [step(_fill(a, names)) for a in recipe.setup]
    return "\n".join(lines)


def _fill(argv: list[str], names: dict[str, str]) -> list[str]:
    return [arg.format_map(names) for arg in argv]


def _step(argv: list[str]) -> None:
    proc.call(argv, what=" ".join(argv[:3]), timeout=600)


def _start(service: Service, names: dict[str, str], stack: ExitStack) -> int:
    """Start a service (killed, with its process group, when `stack`
    closes) and wait until its readiness check passes."""
    argv = _fill(service.command, names)
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
    except (FileNotFoundError, PermissionError) as exc:
        raise MmlabError(f"{argv[0]}: cannot run: {exc.strerror}") from exc
    stack.callback(command.stop, child)
    deadline = time.monotonic() + service.ready_timeout_s
    while service.ready:
        if child.poll() is not None:
            raise MmlabError(f"{' '.join(argv[:3])}: exited with status {child.returncode} "
                             "before it was ready")
        if proc.call(_fill(service.ready, names), check=False, timeout=30).returncode == 0:
            break
        if time.monotonic() > deadline:
            raise MmlabError(f"{' '.join(argv[:3])}: not ready after "
                             f"{service.ready_timeout_s:g} s")
        time.sleep(0.2)
    return child.pid


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
