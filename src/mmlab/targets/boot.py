"""A kernel booted in QEMU, once, running one script.

The guest boots with `-kernel` and `-initrd`, no network, the console on
ttyS0 (kept as a log) and the results on ttyS1, where /init frames stdout,
stderr and the exit status with a SHA-256 each.  KVM is used when the kernel
really boots under it (tried once per kernel and remembered); otherwise TCG
with one host thread per vCPU.  A panic, an oops, an OOM kill or a guest that
never answers is a failed trial carrying the console's tail, never a result;
a kernel that dies before /init starts the trial is tried again.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.kernels import images
from mmlab.machine import paths
from mmlab.machine.knobs import parse_size
from mmlab.targets import initramfs
from mmlab.workloads.mmwork import TrialFailed

QEMU = "qemu-system-x86_64"
CMDLINE = "console=ttyS0 panic=-1 oops=panic loglevel=4 rdinit=/init"
CONSOLE_TAIL = 15
STARTED = "mmlab-guest: running trial"   # /init prints it before the trial
BOOT_RETRIES = 2
FRAME = re.compile(r"^MMLAB-FRAME (\w+) ([0-9a-f]{64}) (\d+)\n(.*?)^MMLAB-END \1$",
                   re.M | re.S)
FAILURE_PATTERNS = (
    ("kernel panic", re.compile(r"Kernel panic - not syncing.*")),
    ("kernel oops", re.compile(r"(Oops:|BUG:|general protection fault).*")),
    ("OOM kill", re.compile(r"Out of memory: Killed process.*")),
)


@dataclass(frozen=True)
class Guest:
    """What a trial's VM looks like."""
    kernel: images.Kernel
    vcpus: int = 1
    memory_mb: int = 1024
    extra_cmdline: str = ""
    timeout_s: float = 600
    numa_nodes: int = 1


class BootFailed(TrialFailed):
    """The guest died before /init started the trial: the boot failed, not the workload."""


def _accel_file(kernel: images.Kernel) -> Path:
    return Path(kernel.dir) / "accel.json"


def accelerator(kernel: images.Kernel, cache: Path) -> tuple[str, str]:
    """('kvm' or 'tcg', why): KVM only if this kernel boots and answers under it."""
    known = _accel_file(kernel)
    if known.exists():
        data = json.loads(known.read_text())
        return data["accel"], data["why"]
    if not Path("/dev/kvm").exists():
        accel, why = "tcg", "no /dev/kvm"
    else:
        try:
            out = boot_once(Guest(kernel, timeout_s=30), "echo kvm-ok", "kvm", cache)
            ok = out.frames.get("stdout", b"").strip() == b"kvm-ok"
            accel, why = ("kvm", "boots under KVM") if ok else ("tcg", "no answer under KVM")
        except TrialFailed as exc:
            accel, why = "tcg", f"KVM boot failed: {exc}"
    known.write_text(json.dumps({"accel": accel, "why": why}))
    return accel, why


@dataclass
class BootResult:
    frames: dict[str, bytes]
    console: str
    seconds: float
    plugin_output: str = ""   # what the instruction-counting plugin wrote (insns.py)


def numa_args(nodes: int, vcpus: int, memory_mb: int) -> list[str]:
    """QEMU's -numa: memory split evenly (node 0 takes the rest), vCPU i on
    node i mod nodes; a node without vCPUs is a memory-only node."""
    if nodes <= 1:
        return []
    if memory_mb // nodes < 64:
        raise MmlabError(f"numa_nodes = {nodes}: {memory_mb} MiB gives each node less than "
                         "64 MiB")
    args = []
    for n in range(nodes):
        size = memory_mb // nodes + (memory_mb % nodes if n == 0 else 0)
        cpus = "".join(f",cpus={c}" for c in range(vcpus) if c % nodes == n)
        args += ["-object", f"memory-backend-ram,id=mem{n},size={size}M",
                 "-numa", f"node,nodeid={n}{cpus},memdev=mem{n}"]
    return args


def _qemu_argv(guest: Guest, initrd: Path, accel: str, console: Path, results: Path,
               disk: Path | None = None) -> list[str]:
    accel_args = (["-accel", "kvm", "-cpu", "host"] if accel == "kvm"
                  else ["-accel", "tcg,thread=multi", "-cpu", "max"])
    disk_args = ["-drive", f"file={disk},format=raw,if=virtio,cache=writeback"] if disk else []
    return [QEMU, "-machine", "pc", *accel_args, "-smp", str(guest.vcpus),
            "-m", str(guest.memory_mb),
            *numa_args(guest.numa_nodes, guest.vcpus, guest.memory_mb),
            "-kernel", str(guest.kernel.image),
            "-initrd", str(initrd), "-append", f"{CMDLINE} {guest.extra_cmdline}".strip(),
            "-display", "none", "-nodefaults", "-no-reboot", *disk_args,
            "-serial", f"file:{console}", "-serial", f"file:{results}"]


def _frames(text: str) -> dict[str, bytes]:
    """Decode and verify every complete frame; a corrupt one is an error."""
    out = {}
    for name, digest, size, body in FRAME.findall(text):
        data = base64.b64decode("".join(body.split()))
        if len(data) != int(size) or hashlib.sha256(data).hexdigest() != digest:
            raise TrialFailed(f"guest result '{name}' arrived corrupted "
                              f"({len(data)} of {size} bytes, checksum mismatch)")
        out[name] = data
    return out


def _tail(console: str) -> str:
    lines = [ln for ln in console.splitlines() if ln.strip()]
    return " | ".join(lines[-CONSOLE_TAIL:])


def boot_once(guest: Guest, script: str, accel: str, cache: Path, swap: str | None = None,
          archives: tuple[Path, ...] = (), plugin: Path | None = None,
          plugin_args: tuple[str, ...] = ()) -> BootResult:
    """One boot running `script`; `archives` are further initramfs parts
    (an exec workload's program and libraries); `plugin` is mmlab's TCG
    plugin (qemu_plugin.py), loaded to count instructions, with
    `plugin_args` besides its output file."""
    with tempfile.TemporaryDirectory(prefix="mmlab-guest-") as tmp:
        tmpd = Path(tmp)
        extra = [initramfs.modules_archive(guest.kernel)] if needs_modules(guest.kernel, swap) \
            else []
        extra += archives
        initrd = initramfs.trial_initrd(initramfs.base_archive(cache), script, tmpd / "initrd",
                                        extra)
        console, results = tmpd / "console.log", tmpd / "results.log"
        disk = None
        if swap and swap.startswith("file:"):
            disk = tmpd / "swap.img"
            with open(disk, "wb") as f:          # sparse: blocks appear as the guest swaps
                f.truncate(parse_size(swap.split(":", 1)[1]))
        counts = tmpd / "insns.jsonl"
        argv = _qemu_argv(guest, initrd, accel, console, results, disk) + \
            (["-plugin", ",".join((str(plugin), f"out={counts}", *plugin_args))] if plugin else [])
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _, err = proc.communicate(timeout=guest.timeout_s)
            hung = False
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            hung = True
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        seconds = time.monotonic() - t0
        text = console.read_text(errors="replace") if console.exists() else ""
        res = results.read_text(errors="replace") if results.exists() else ""
        counted = counts.read_text() if counts.exists() else ""
    for what, pattern in FAILURE_PATTERNS:
        m = pattern.search(text)
        if m and what != "OOM kill":
            failed = TrialFailed if STARTED in text else BootFailed
            raise failed(f"{what} in the guest ({guest.kernel.name}): {m.group(0).strip()}; "
                              f"console: {_tail(text)}")
    if hung:
        raise TrialFailed(f"guest hung: no result from {guest.kernel.name} after "
                          f"{guest.timeout_s:g} s; console: {_tail(text)}")
    if proc.returncode and "MMLAB-DONE" not in res:
        raise TrialFailed(f"qemu exited {proc.returncode}: "
                          f"{(err.strip().splitlines() or ['?'])[-1]}")
    frames = _frames(res)
    if "MMLAB-DONE" not in res or set(frames) != {"rc", "stdout", "stderr"}:
        raise TrialFailed(f"guest {guest.kernel.name} stopped without a complete result; "
                          f"console: {_tail(text)}")
    oom = FAILURE_PATTERNS[2][1].search(text)
    rc = int(frames["rc"].strip() or b"-1")
    if rc and oom:
        raise TrialFailed(f"workload killed by the OOM killer in the guest: "
                          f"{oom.group(0).strip()}")
    return BootResult(frames, text, seconds, counted)


def needs_modules(kernel: images.Kernel, swap: str | None) -> bool:
    """Does this swap need modules of the kernel's (zram, virtio_blk as modules)?"""
    if not swap or swap == "none":
        return False
    option = "CONFIG_ZRAM" if swap.startswith("zram:") else "CONFIG_VIRTIO_BLK"
    value = kernel.option(option)
    if value == "m" and not kernel.modules:
        raise MmlabError(f"swap = {swap}: {kernel.name} has {option}=m but no modules were "
                         f"stored with it; fetch it again (mmlab kernels add {kernel.name})")
    if value not in ("y", "m"):
        raise MmlabError(f"swap = {swap}: {kernel.name} has no {option} "
                         "(build it with that option)")
    return value == "m"


def boot_retrying(guest: Guest, script: str, accel: str, cache: Path, swap: str | None,
                   archives: tuple[Path, ...], plugin: Path | None,
                   plugin_args: tuple[str, ...] = ()) -> tuple[BootResult, int]:
    """A boot and how many retries it took: tried again when the kernel
    failed before the trial began, the last failure raised."""
    for retry in range(BOOT_RETRIES):
        try:
            return boot_once(guest, script, accel, cache, swap, archives, plugin, plugin_args), retry
        except BootFailed:
            continue
    return boot_once(guest, script, accel, cache, swap, archives, plugin, plugin_args), BOOT_RETRIES


def run_script(guest: Guest, script: str, archives: tuple[Path, ...] = (),
               cache: Path | None = None) -> str:
    """The stdout of `script` run as the guest's /trial.sh in one boot, with
    no mmwork around it: a peer tool run as it is, to set beside mmlab's
    trial of it (bench.py's agreement part).  A non-zero exit is TrialFailed."""
    cache = cache or initramfs_cache()
    accel, _ = accelerator(guest.kernel, cache)
    boot = boot_once(guest, script, accel, cache, None, archives)
    if int(boot.frames["rc"].strip()):
        raise TrialFailed(f"script failed in the guest ({guest.kernel.name}): "
                          f"{boot.frames['stderr'].decode(errors='replace').strip()[-200:]}")
    return boot.frames["stdout"].decode(errors="replace")


def qemu_version() -> str:
    proc = subprocess.run([QEMU, "--version"], capture_output=True, text=True)
    return proc.stdout.splitlines()[0] if proc.returncode == 0 else "not installed"


def initramfs_cache() -> Path:
    return paths.cache_root() / "initramfs"
