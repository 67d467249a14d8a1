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
import functools
import hashlib
import json
import re
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.kernels import images
from mmlab.machine import paths
from mmlab.machine.knobs import parse_size
from mmlab.targets import hostroot, initramfs, kvm
from mmlab.workloads.mmwork import TrialFailed

QEMU = "qemu-system-x86_64"
# A soft lockup panics (and panic=-1 ends QEMU) rather than spinning until
# timeout_s: a 6.12.101 guest swapping to zram locked up and held its
# trial for the full 600 s.
# What every kernel mmlab boots is told besides where its console is: a
# panic or an oops ends the boot at once (a guest's QEMU exits; a bare-metal
# machine reboots and its boot loader starts its base kernel again).
KERNEL_ARGS = "panic=-1 oops=panic softlockup_panic=1 loglevel=4 rdinit=/init"
CMDLINE = f"console=ttyS0 {KERNEL_ARGS}"
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

# Kernel defaults a guest's memory changes (judge/audit.py: below 512 MiB the
# kernel boots with every THP flag cleared; min_free_kbytes scales with
# memory), printed on the console by the trial's /trial.sh: the THP flags
# before the arm's settings (state boot_<key>), min_free_kbytes after them.
THP_DIR = "/sys/kernel/mm/transparent_hugepage"
KERNEL_DEFAULTS = {
    "boot": {"thp_enabled": f"{THP_DIR}/enabled", "thp_defrag": f"{THP_DIR}/defrag",
             "thp_use_zero_page": f"{THP_DIR}/use_zero_page",
             "thp_khugepaged_defrag": f"{THP_DIR}/khugepaged/defrag"},
    "set": {"min_free_kbytes": "/proc/sys/vm/min_free_kbytes"}}
DEFAULT_MARK = re.compile(r"^mmlab-guest: (boot|set) (\w+) ([^\r\n]*)", re.M)


def default_lines(when: str) -> list[str]:
    """Lines of /trial.sh printing the kernel defaults read `when` ("boot":
    before the arm's settings, "set": after them) on the console, marked."""
    return [f'echo "mmlab-guest: {when} {key} $(cat {path} 2>/dev/null || echo absent)" '
            "> /dev/ttyS0" for key, path in KERNEL_DEFAULTS[when].items()]


def kernel_defaults(console: str) -> dict[str, str | float]:
    """The marked readings as sample state: a choice ("always madvise
    [never]") as the one chosen, a number as a number."""
    out: dict[str, str | float] = {}
    for when, key, text in DEFAULT_MARK.findall(console):
        chosen = re.search(r"\[([^\]]+)\]", text)
        value = chosen.group(1) if chosen else text.strip()
        out[f"boot_{key}" if when == "boot" else key] = \
            float(value) if value.isdigit() else value
    return out


@dataclass(frozen=True)
class Guest:
    """What a trial's VM looks like."""
    kernel: images.Kernel
    vcpus: int = 1
    memory_mb: int = 1024
    extra_cmdline: str = ""
    timeout_s: float = 600
    numa_nodes: int = 1
    start: str = "snapshot"   # "snapshot": restored from a saved boot (snapshot.py); "boot"
    state: int = 0            # which of the kernel's saved boots it is restored from
    host_root: bool = False   # this machine's / mounted read-only at /host (hostroot.py)


class BootFailed(TrialFailed):
    """The guest died before /init started the trial: the boot failed, not
    the workload.  `reason` is the failure without what varies from boot to
    boot (times, addresses in the console's tail): the same reason twice in
    a row is the kernel's or the command line's, not an emulation flake."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


def _accel_file(kernel: images.Kernel) -> Path:
    return Path(kernel.dir) / "accel.json"


DEV_KVM = Path("/dev/kvm")
PVM_MODULE = Path("/sys/module/kvm_pvm")
CPUINFO = Path("/proc/cpuinfo")


def kvm_refused() -> str:
    """Why no kernel can run under this machine's /dev/kvm, found without
    booting one ("" where a probe boot must tell): none there; a PVM
    /dev/kvm (the kvm_pvm module: stock kernels cannot run under it); or a
    CPU without vmx or svm, whose /dev/kvm cannot run a hardware guest."""
    if not DEV_KVM.exists():
        return "no /dev/kvm"
    if PVM_MODULE.exists():
        return "this /dev/kvm is PVM (kvm_pvm), which stock kernels cannot run under"
    flags = next((line for line in CPUINFO.read_text().splitlines()
                  if line.startswith("flags")), "").split()
    if "vmx" not in flags and "svm" not in flags:
        return "the CPU has no vmx or svm: this /dev/kvm cannot run a hardware guest"
    return ""


def accelerator(kernel: images.Kernel, cache: Path) -> tuple[str, str]:
    """('kvm' or 'tcg', why): TCG at once where the machine's /dev/kvm
    cannot serve (kvm_refused); else KVM only if this kernel boots and
    answers under it (one probe boot, its answer kept with the kernel)."""
    refused = kvm_refused()
    if refused:
        return "tcg", refused
    known = _accel_file(kernel)
    if known.exists():
        data = json.loads(known.read_text())
        return data["accel"], data["why"]
    try:
        out = boot_once(Guest(kernel, timeout_s=30), "echo kvm-ok", "kvm", cache)
        ok = out.frames.get("stdout", b"").strip() == b"kvm-ok"
        accel, why = ("kvm", "boots under KVM") if ok else ("tcg", "no answer under KVM")
    except TrialFailed as exc:
        accel, why = "tcg", f"KVM boot failed: {str(exc).splitlines()[0][:200]}"
    known.write_text(json.dumps({"accel": accel, "why": why}))
    return accel, why


@dataclass
class BootResult:
    frames: dict[str, bytes]
    console: str
    seconds: float
    plugin_output: str = ""   # what the instruction-counting plugin wrote (insns.py)
    start: str = "booted"     # or "restored" from a snapshot of a booted guest
    why_booted: str = ""      # why a guest meant to be restored was booted
    state: str = ""           # the saved boot it was restored from ("": booted, its own)

    def labels(self) -> dict[str, str | float]:
        """Its samples' labels: how the guest started, and from which saved
        boot (snapshot.py; "" when booted, a state of its own)."""
        return {"guest_start": self.start, "guest_state": self.state}


def numa_args(nodes: int, vcpus: int, memory_mb: int, prealloc: bool = False) -> list[str]:
    """QEMU's -numa: memory split evenly (node 0 takes the rest), vCPU i on
    node i mod nodes; a node without vCPUs is a memory-only node; under KVM
    each node's memory preallocated (kvm.py)."""
    if nodes <= 1:
        return []
    if memory_mb // nodes < 64:
        raise MmlabError(f"numa_nodes = {nodes}: {memory_mb} MiB gives each node less than "
                         "64 MiB")
    args = []
    for n in range(nodes):
        size = memory_mb // nodes + (memory_mb % nodes if n == 0 else 0)
        cpus = "".join(f",cpus={c}" for c in range(vcpus) if c % nodes == n)
        args += ["-object", f"memory-backend-ram,id=mem{n},size={size}M"
                 + (",prealloc=on" if prealloc else ""),
                 "-numa", f"node,nodeid={n}{cpus},memdev=mem{n}"]
    return args


def qemu_argv(guest: Guest, initrd: Path, accel: str, console: Path, results: list[str],
              disk: Path | None = None) -> list[str]:
    """The guest's QEMU command line; `results` are the arguments giving it
    its second serial port (a file, or a socket for a restored guest)."""
    accel_args = (kvm.args(guest.memory_mb, guest.numa_nodes) if accel == "kvm"
                  else ["-accel", "tcg,thread=multi", "-cpu", "max"])
    disk_args = ["-drive", f"file={disk},format=raw,if=virtio,cache=writeback"] if disk else []
    return [QEMU, "-machine", "pc", *accel_args, "-smp", str(guest.vcpus),
            "-m", str(guest.memory_mb),
            *numa_args(guest.numa_nodes, guest.vcpus, guest.memory_mb, accel == "kvm"),
            "-kernel", str(guest.kernel.image),
            "-initrd", str(initrd), "-append", f"{CMDLINE} {guest.extra_cmdline}".strip(),
            "-display", "none", "-nodefaults", "-no-reboot", *disk_args,
            "-serial", f"file:{console}", *results]


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


def tail(console: str) -> str:
    """The console's last lines, on one line, for an error message."""
    lines = [ln for ln in console.splitlines() if ln.strip()]
    return " | ".join(lines[-CONSOLE_TAIL:])


def trial_parts(guest: Guest, swap: str | None, archives: tuple[Path, ...]) -> list[Path]:
    """The initramfs parts after the base: the kernel's modules when the
    swap needs them, then `archives` (an exec workload's program)."""
    mods = [initramfs.modules_archive(guest.kernel)] if needs_modules(guest.kernel, swap) else []
    return mods + list(archives)


def swap_disk_size(swap: str | None) -> int:
    """Bytes of the virtio disk a `file:` swap gives the guest (0: no disk)."""
    if not swap or not swap.startswith("file:"):
        return 0
    return parse_size(swap.split(":", 1)[1])


def swap_disk(tmpd: Path, swap: str | None) -> Path | None:
    """A sparse file of the swap's size for a `file:` swap: blocks appear
    only as the guest swaps."""
    size = swap_disk_size(swap)
    if not size:
        return None
    disk = tmpd / "swap.img"
    with open(disk, "wb") as f:
        f.truncate(size)
    return disk


def plugin_args(plugin: Path | None, counts: Path, args: tuple[str, ...]) -> list[str]:
    """QEMU's -plugin for mmlab's instruction-counting plugin, if any."""
    return ["-plugin", ",".join((str(plugin), f"out={counts}", *args))] if plugin else []


@dataclass
class QemuExit:
    """How a QEMU process ended."""
    returncode: int | None
    stderr: str
    hung: bool
    seconds: float


_STARTED: set[subprocess.Popen] = set()    # this process's guests (end_guests)
_STARTED_LOCK = threading.Lock()


def start_qemu(argv: list[str], accel: str, vcpus: int) -> subprocess.Popen:
    """QEMU started; under KVM its vCPU threads pinned once they exist.
    The guest is remembered until it has exited, for `end_guests`."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with _STARTED_LOCK:
        _STARTED.difference_update([p for p in _STARTED if p.poll() is not None])
        _STARTED.add(proc)
    if accel == "kvm":
        kvm.pin(proc, vcpus)
    return proc


def end_guests() -> None:
    """Kill every guest this process started that still runs: trials run
    side by side wait on theirs in worker threads, which a Ctrl-C on the
    main thread does not reach; their waits then return at once."""
    with _STARTED_LOCK:
        for proc in _STARTED:
            if proc.poll() is None:
                proc.kill()


def connect(proc: subprocess.Popen, path: Path, deadline: float) -> socket.socket:
    """A connection to QEMU's socket at `path` (a serial port's chardev),
    retried while QEMU starts."""
    while True:
        conn = socket.socket(socket.AF_UNIX)
        try:
            conn.connect(str(path))
            return conn
        except (FileNotFoundError, ConnectionRefusedError):
            conn.close()
            still_starting(proc, deadline)
            time.sleep(0.005)


def still_starting(proc: subprocess.Popen, deadline: float) -> None:
    """Fail (TrialFailed) if QEMU exited or the deadline passed while it started."""
    if proc.poll() is not None:
        err = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
        raise TrialFailed(f"qemu exited {proc.returncode} while starting: "
                          f"{err[-1] if err else '?'}")
    if time.monotonic() > deadline:
        raise TrialFailed("the guest never started")


def wait_qemu(proc: subprocess.Popen, timeout_s: float, t0: float) -> QemuExit:
    """Wait for QEMU to exit; kill it after `timeout_s` (hung) or on any
    interruption, so no guest outlives its trial."""
    try:
        _, err = proc.communicate(timeout=max(0.1, timeout_s - (time.monotonic() - t0)))
        hung = False
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        hung = True
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return QemuExit(proc.returncode, err or "", hung, time.monotonic() - t0)


def failure(console: str) -> tuple[str, str] | None:
    """How the kernel failed, if it did: ("kernel panic" or "kernel oops",
    the console's line saying so, without its timestamp)."""
    for what, pattern in FAILURE_PATTERNS[:2]:
        m = pattern.search(console)
        if m:
            return what, m.group(0).strip()
    return None


def result(guest: Guest, console: str, results: str, ended: QemuExit,
           counted: str = "") -> BootResult:
    """The trial's result from what the guest wrote, or the failure that
    stopped it: a panic or oops (BootFailed if before the trial began), a
    hang, a QEMU error, an incomplete result, an OOM-killed workload."""
    failed = failure(console)
    if failed:
        what, line = failed
        message = f"{what} in the guest ({guest.kernel.name}): {line}; console: {tail(console)}"
        if STARTED in console:
            raise TrialFailed(message)
        raise BootFailed(message, line)
    if ended.hung:
        raise TrialFailed(f"guest hung: no result from {guest.kernel.name} after "
                          f"{guest.timeout_s:g} s; console: {tail(console)}")
    if ended.returncode and "MMLAB-DONE" not in results:
        raise TrialFailed(f"qemu exited {ended.returncode}: "
                          f"{(ended.stderr.strip().splitlines() or ['?'])[-1]}")
    frames = _frames(results)
    if "MMLAB-DONE" not in results or set(frames) != {"rc", "stdout", "stderr"}:
        raise TrialFailed(f"guest {guest.kernel.name} stopped without a complete result; "
                          f"console: {tail(console)}")
    oom = FAILURE_PATTERNS[2][1].search(console)
    rc = int(frames["rc"].strip() or b"-1")
    if rc and oom:
        raise TrialFailed(f"workload killed by the OOM killer in the guest: "
                          f"{oom.group(0).strip()}")
    return BootResult(frames, console, ended.seconds, counted)


def read_text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def boot_once(guest: Guest, script: str, accel: str, cache: Path, swap: str | None = None,
              archives: tuple[Path, ...] = (), plugin: Path | None = None,
              plugin_extra: tuple[str, ...] = ()) -> BootResult:
    """One boot running `script`; `archives` are further initramfs parts
    (an exec workload's program and libraries); `plugin` is mmlab's TCG
    plugin (qemu_plugin.py), loaded to count instructions, with
    `plugin_extra` besides its output file."""
    with tempfile.TemporaryDirectory(prefix="mmlab-guest-") as tmp, ExitStack() as stack:
        tmpd = Path(tmp)
        initrd = initramfs.trial_initrd(initramfs.base_archive(cache), script, tmpd / "initrd",
                                        trial_parts(guest, swap, archives))
        console, results, counts = tmpd / "console.log", tmpd / "results.log", tmpd / "insns.jsonl"
        argv = qemu_argv(guest, initrd, accel, console, ["-serial", f"file:{results}"],
                         swap_disk(tmpd, swap)) + plugin_args(plugin, counts, plugin_extra)
        if guest.host_root:
            argv += hostroot.qemu_args(stack.enter_context(hostroot.served(tmpd)),
                                       guest.memory_mb)
        t0 = time.monotonic()
        proc = start_qemu(argv, accel, guest.vcpus)
        ended = wait_qemu(proc, guest.timeout_s, t0)
        return result(guest, read_text(console), read_text(results), ended, read_text(counts))


def needs_modules(kernel: images.Kernel, swap: str | None) -> bool:
    """Does this swap need modules of the kernel's (zram, virtio_blk as modules)?"""
    if not swap or swap == "none":
        return False
    option = "CONFIG_ZRAM" if swap.startswith("zram:") else "CONFIG_VIRTIO_BLK"
    return is_module(kernel, option, f"swap = {swap}")


def is_module(kernel: images.Kernel, option: str, what: str) -> bool:
    """Is the driver `what` needs a module of the kernel's (True) or built in
    (False)?  Neither, or a module not stored with the kernel: an MmlabError
    naming `what`."""
    value = kernel.option(option)
    if value == "m" and not kernel.modules:
        raise MmlabError(f"{what}: {kernel.name} has {option}=m but no modules were "
                         f"stored with it; fetch it again (mmlab kernels add {kernel.name})")
    if value not in ("y", "m"):
        raise MmlabError(f"{what}: {kernel.name} has no {option} "
                         "(build it with that option)")
    return value == "m"


def boot_retrying(guest: Guest, script: str, accel: str, cache: Path, swap: str | None,
                  archives: tuple[Path, ...], plugin: Path | None,
                  plugin_extra: tuple[str, ...] = ()) -> tuple[BootResult, int]:
    """A boot and how many retries it took (`retrying`)."""
    return retrying(lambda: boot_once(guest, script, accel, cache, swap, archives, plugin,
                                      plugin_extra))


def retrying(start: Callable[[], BootResult]) -> tuple[BootResult, int]:
    """A guest started by `start` (booted or restored) and how many retries
    it took: started again when the kernel failed before the trial began,
    the last failure raised.  Emulated guests now and then die early, with
    CPU state no kernel makes (EFLAGS holding a pointer's bits): 9 of a
    suite's 4,248 restores, on eight kernels; or an int3 oops in code being
    patched at boot on another vCPU (sched_clock_cpu, 6.12, two vCPUs under
    MTTCG); the next start is fine.  A
    failure that repeats itself (`repeated`) is not tried a third time."""
    before: BootFailed | None = None
    for retry in range(BOOT_RETRIES):
        try:
            return start(), retry
        except BootFailed as exc:
            if repeated(before, exc):
                raise
            before = exc
    return start(), BOOT_RETRIES


def repeated(before: BaseException | None, now: BaseException) -> bool:
    """Two boots in a row failed the same way (a guest command line naming
    no init panics alike every time): starting again cannot help."""
    return (isinstance(before, BootFailed) and isinstance(now, BootFailed)
            and before.reason == now.reason)


def run_script(guest: Guest, script: str, archives: tuple[Path, ...] = (),
               cache: Path | None = None) -> str:
    """The stdout of `script` run as the guest's /trial.sh in one boot, with
    no mmwork around it: a peer tool run as it is, to set beside mmlab's
    trial of it (bench.py's agreement part), or kallsyms read for counting
    by function.  A boot that dies before the script is started again, as a
    trial's is; a non-zero exit is TrialFailed."""
    cache = cache or initramfs_cache()
    accel, _ = accelerator(guest.kernel, cache)
    boot, _ = retrying(lambda: boot_once(guest, script, accel, cache, None, archives))
    if int(boot.frames["rc"].strip()):
        raise TrialFailed(f"script failed in the guest ({guest.kernel.name}): "
                          f"{boot.frames['stderr'].decode(errors='replace').strip()[-200:]}")
    return boot.frames["stdout"].decode(errors="replace")


@functools.cache
def qemu_version() -> str:
    """QEMU's version line, asked once per process: every trial's environment
    and snapshot key name it."""
    proc = subprocess.run([QEMU, "--version"], capture_output=True, text=True)
    return proc.stdout.splitlines()[0] if proc.returncode == 0 else "not installed"


def initramfs_cache() -> Path:
    return paths.cache_root() / "initramfs"
