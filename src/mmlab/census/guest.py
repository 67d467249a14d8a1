"""A command's census inside a QEMU guest booted on a Debian kernel.

The static mmcensus travels in the initramfs like mmwork, and the command
with the shared libraries it loads like an exec workload's program
(initramfs.files_archive at the same absolute paths): no Python, bpftrace or
drgn is needed in the guest, only its kernel's BTF, which Debian's kernels
carry.  So does every file the command names (a script, a second program
such as the one ksm_exec runs), each from a content-addressed copy, since
the guest mounts a fresh /tmp over the initramfs's and a recipe's programs
are built in a temporary folder.  Global settings a recipe asks for (KSM)
are written inside the guest before the command starts: the guest is its
own machine, so the host's settings are never touched.

A program that cannot travel that way (a JVM reads its whole JDK tree, a
database needs its users and data folder) runs instead in a chroot of this
machine's root, mounted read-only in the guest (HostRoot, hostroot.py),
after its recipe's steps have run there too.

The guest reads the command's tree with mmcensus every interval until it
exits, and once more as it exits (it runs under `mmcensus --hold`, as on
the host), and prints each moment; the host groups them as it groups its
own.
The guest's smaps stays in the guest, so its groups have no pattern.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from mmlab.census import command, iterator
from mmlab.census.records import CommandCensus
from mmlab.errors import MmlabError
from mmlab.kernels import images
from mmlab.machine.knobs import DamonActors, HostSettings
from mmlab.targets import hostroot, initramfs
from mmlab.targets.boot import Guest, initramfs_cache, run_script
from mmlab.workloads.build import built
from mmlab.workloads.execwork import shared_libraries

MARK = "MMLAB-CENSUS"
KSM = "/sys/kernel/mm/ksm"
UNCHANGED = HostSettings()      # the default: the guest's settings as it boots


@dataclass(frozen=True)
class HostRoot:
    """A command run in a chroot of the host's root (hostroot.py) rather
    than carried in the initramfs: `here` is the host folder seen at
    hostroot.HERE, `steps` a shell script run there first (a recipe's
    prepare, services and setup), whose services' PIDs it appends to
    SERVICES so that their trees are sampled with the command's."""
    here: Path
    steps: str = ""


SERVICES = "/tmp/mmlab-services"      # in the chroot


def script(argv: list[str], mmcensus: Path, interval_s: float,
           settings: HostSettings = UNCHANGED, root: HostRoot | None = None) -> str:
    """The guest's /trial.sh: write the settings (and with `root`, mount the
    host's root and run its steps in a chroot of it), start the command,
    census every interval until it exits (with KSM's shared pages when
    ksmd runs), then its exit status and last words."""
    lines = []
    for knob, value in settings.fixed_files():
        path = shlex.quote(knob.path)
        lines += [f"[ -w {path} ] || {{ echo '{knob.path}: not on this kernel' >&2; exit 92; }}",
                  f"echo {shlex.quote(value)} > {path}"]
    if settings.damon == "off":
        lines += DamonActors.shell_off()
    start = shlex.join(argv)
    # each moment's KSM reading, the one at the command's exit too
    ksm = f'[ -r {KSM}/run ] && echo "{MARK} ksm $(cat {KSM}/run) $(cat {KSM}/pages_sharing)"'
    if root is not None:
        lines += _in_host_root(root)
        start = f"chroot {hostroot.MOUNTED} {start}"
    return "\n".join([
        *lines,
        # held: mmcensus takes one more census at the command's exit (its
        # first line names the command's PID), so a short one is seen too
        f"{mmcensus} --hold /tmp/held -- {start} > /tmp/cmd.out 2>&1 &",
        "holder=$!",
        "until [ -s /tmp/held ] || ! kill -0 $holder 2>/dev/null; do sleep 0.01; done",
        "pid=$(sed -n '1s/^pid //p' /tmp/held)",
        f'echo "{MARK} pid ${{pid:-0}}"',
        # until it exits: a zombie has no maps, but neither has a process
        # in the middle of its exec (the chroot's), so ask for its state
        "while grep -q '^State:[^Z]*$' /proc/$pid/status 2>/dev/null; do",
        f'  echo "{MARK} moment $(cut -d" " -f1 /proc/uptime)"',
        f"  {mmcensus} || exit 90",
        f"  {ksm}",
        f"  sleep {interval_s:g}",
        "done",
        "wait $holder",
        "code=$?",
        f'echo "{MARK} moment $(cut -d" " -f1 /proc/uptime)"',
        "tail -n +2 /tmp/held",
        ksm,
        f'echo "{MARK} exit $code"',
        f'echo "{MARK} words $(tail -3 /tmp/cmd.out | tr "\\n" "|" | sed "s/|$//; s/|/ | /g")"',
    ]) + "\n"


def _in_host_root(root: HostRoot) -> list[str]:
    """Mount the host's root, run the steps in a chroot of it (a failing
    one is reported and ends the census), and name the services' PIDs."""
    return [f"MMLAB_HERE={shlex.quote(str(root.here))}", hostroot.MOUNT,
            f"cat > {hostroot.MOUNTED}/tmp/mmlab-steps.sh <<'MMLAB-STEPS'",
            root.steps, "MMLAB-STEPS",
            f"touch {hostroot.MOUNTED}{SERVICES}",
            f"chroot {hostroot.MOUNTED} /bin/sh /tmp/mmlab-steps.sh > /tmp/steps.out 2>&1 "
            f'|| {{ echo "{MARK} failed $(tail -3 /tmp/steps.out | tr "\\n" " ")"; exit 0; }}',
            f"for p in $(cat {hostroot.MOUNTED}{SERVICES}); do echo \"{MARK} also $p\"; done"]


def survey(kernel: str, argv: list[str], interval_s: float = 0.5, top: int = 5,
           memory_mb: int = 1024, vcpus: int = 1, settings: HostSettings = UNCHANGED,
           timeout_s: float = 600, root: HostRoot | None = None) -> CommandCensus:
    """Boot `kernel` (debian:6.12, ...), write `settings` there, run `argv`
    there and return its census at the peak, as command.survey does on the
    host.  Without `root` the command travels in the initramfs, and
    `memory_mb` must hold it (the program and its libraries, unpacked)
    besides what the program maps; with it, the command runs in a chroot of
    the host's root after `root.steps`."""
    if settings.swap is not None:
        raise MmlabError(f"swap = {settings.swap}: a census guest has no swap device "
                         "(run it with mmlab run --kernel)")
    cache = initramfs_cache()
    mmcensus = _kept(built("mmcensus"), cache)    # the build folder may be under /tmp
    image = images.get(kernel)
    if root is None:
        guest_argv, packed = travelling(argv, cache)
    else:
        hostroot.check(image)
        guest_argv, packed = argv, []
    guest = Guest(image, vcpus=vcpus, memory_mb=memory_mb, timeout_s=timeout_s,
                  host_root=root is not None)
    t0 = time.monotonic()
    out = run_script(guest, script(guest_argv, mmcensus, interval_s, settings, root),
                     (initramfs.files_archive([mmcensus, *packed], cache),), cache)
    return parse(out, argv, top, time.monotonic() - t0, f"{kernel} ({guest.kernel.version})")


def travelling(argv: list[str], cache: Path) -> tuple[list[str], list[Path]]:
    """The command as the guest runs it, and the files it needs there: the
    program (found on PATH), every argument naming a file (a script, the
    program ksm_exec runs), each as a copy kept by content, and the shared
    libraries of each ELF among them, at their host paths.  Other
    arguments pass unchanged."""
    found = shutil.which(argv[0])
    if found is None:
        raise MmlabError(f"{argv[0]}: no such program to carry into the guest")
    out, files = [], []
    for i, arg in enumerate(argv):
        path = Path(found if i == 0 else arg)
        if i and not path.is_file():
            out.append(arg)
            continue
        kept = _kept(path, cache)
        out.append(str(kept))
        files.append(kept)
        if _is_elf(kept):
            files += [lib for lib in shared_libraries(kept) if lib not in files]
    return out, files


def _is_elf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def _kept(program: Path, cache: Path) -> Path:
    """A copy of `program` in the cache, by content: the guest mounts a
    fresh /tmp over the initramfs's, so a program there would vanish."""
    data = program.read_bytes()
    kept = cache / "programs" / hashlib.sha256(data).hexdigest()[:16] / program.name
    if not kept.exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(program, kept)
    return kept


def parse(out: str, argv: list[str], top: int, seconds: float, kernel: str) -> CommandCensus:
    """The guest's moments, grouped; its peak as in command.Moments."""
    pid, code, words, also = 0, None, "", set()
    seen: list[tuple[float, list[str], int | None]] = []
    for line in out.splitlines():
        if not line.startswith(MARK):
            if seen:
                seen[-1][1].append(line)
            continue
        _, what, value = line.split(" ", 2)
        if what == "pid":
            pid = int(value)
        elif what == "also":
            also.add(int(value))
        elif what == "failed":
            raise MmlabError(f"{' '.join(argv)}: a step before it failed in the guest: "
                             f"{value.strip() or '(no output)'}")
        elif what == "moment":
            seen.append((float(value), [], None))
        elif what == "ksm" and seen:
            run, sharing = value.split()
            seen[-1] = (*seen[-1][:2], int(sharing) if run == "1" else None)
        elif what == "words":
            words = value.strip()
        else:
            code = int(value)
    if code is None:
        raise MmlabError(f"{' '.join(argv)}: the guest's census did not finish (no exit status)")
    if code:
        raise MmlabError(f"{' '.join(argv)}: exited with status {code} in the guest: "
                         f"{words or '(no output)'}")
    moments = command.Moments({pid, *also}, top, patterns=False)
    start = seen[0][0] if seen else 0.0
    for at, lines, ksm in seen:
        moments.add(at - start, iterator.parse("\n".join(lines)), time.perf_counter(), ksm)
    found = moments.result(argv, code, seconds, words or "(no output)")
    found.peak.kernel = kernel
    return found
