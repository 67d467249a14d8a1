"""A command's census inside a QEMU guest booted on a Debian kernel.

The static mmcensus travels in the initramfs like mmwork, and the command
with the shared libraries it loads like an exec workload's program
(initramfs.files_archive at the same absolute paths): no Python, bpftrace or
drgn is needed in the guest, only its kernel's BTF, which Debian's kernels
carry.  The guest samples the command's tree with mmcensus every interval
until it exits and prints the samples; the host groups them as it groups
its own.  The guest's smaps stays in the guest, so its groups have no
pattern.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import time
from pathlib import Path

from mmlab.census import command, iterator
from mmlab.census.records import CommandCensus
from mmlab.errors import MmlabError
from mmlab.kernels import images
from mmlab.targets import initramfs
from mmlab.targets.boot import Guest, initramfs_cache, run_script
from mmlab.workloads.build import built
from mmlab.workloads.execwork import shared_libraries

MARK = "MMLAB-CENSUS"


def script(argv: list[str], mmcensus: Path, interval_s: float) -> str:
    """The guest's /trial.sh: start the command, census every interval while
    its address space exists, then its exit status and last words."""
    return "\n".join([
        f"{shlex.join(argv)} > /tmp/cmd.out 2>&1 &",
        "pid=$!",
        f'echo "{MARK} pid $pid"',
        "while grep -q . /proc/$pid/maps 2>/dev/null; do",
        f'  echo "{MARK} sample $(cut -d" " -f1 /proc/uptime)"',
        f"  {mmcensus} || exit 90",
        f"  sleep {interval_s:g}",
        "done",
        "wait $pid",
        f'echo "{MARK} exit $?"',
        f'echo "{MARK} words $(tail -3 /tmp/cmd.out | tr "\\n" " ")"',
    ]) + "\n"


def run(kernel: str, argv: list[str], interval_s: float = 0.5, top: int = 5,
        memory_mb: int = 1024, vcpus: int = 1) -> CommandCensus:
    """Boot `kernel` (debian:6.12, ...), run `argv` there and return its
    census at the peak, as command.run does on the host."""
    found = shutil.which(argv[0])
    if found is None:
        raise MmlabError(f"{argv[0]}: no such program to carry into the guest")
    mmcensus = built("mmcensus")
    cache = initramfs_cache()
    program = _kept(Path(found), cache)
    packed = [mmcensus, program, *shared_libraries(program)]
    guest = Guest(images.get(kernel), vcpus=vcpus, memory_mb=memory_mb)
    t0 = time.monotonic()
    out = run_script(guest, script([str(program), *argv[1:]], mmcensus, interval_s),
                     (initramfs.files_archive(packed, cache),), cache)
    return parse(out, argv, top, time.monotonic() - t0, f"{kernel} ({guest.kernel.version})")


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
    """The guest's samples, grouped; its peak as in command.Watch."""
    pid, code, words = 0, None, ""
    samples: list[tuple[float, list[str]]] = []
    for line in out.splitlines():
        if not line.startswith(MARK):
            if samples:
                samples[-1][1].append(line)
            continue
        _, what, value = line.split(" ", 2)
        if what == "pid":
            pid = int(value)
        elif what == "sample":
            samples.append((float(value), []))
        elif what == "words":
            words = value.strip()
        else:
            code = int(value)
    if code is None:
        raise MmlabError(f"{' '.join(argv)}: the guest's census did not finish (no exit status)")
    if code:
        raise MmlabError(f"{' '.join(argv)}: exited with status {code} in the guest: "
                         f"{words or '(no output)'}")
    watch = command.Watch({pid}, top, patterns=False)
    start = samples[0][0] if samples else 0.0
    for at, lines in samples:
        watch.add(at - start, iterator.parse("\n".join(lines)), time.perf_counter())
    found = watch.result(argv, code, seconds)
    found.peak.kernel = kernel
    return found
