"""Run a workload on another kernel, booted in QEMU.

The guest boots with `-kernel` and `-initrd`, no network, the console on
ttyS0 (kept as a log) and the results on ttyS1, where /init frames stdout,
stderr and the exit status with a SHA-256 each.  One boot runs one trial:
its warm-ups and all its samples, so boot time stays out of the
measurements.

Swap in a guest is the arm's `swap`: `zram:SIZE` is a zram device of the
guest's own kernel, `file:SIZE` a virtio disk of SIZE (a sparse file on the
host) used whole as the guest's swap device.  The kernel's own modules
(zram, its compressors, virtio_blk) go into the initramfs when they are
modules.  `numa_nodes` splits the guest's memory (and its vCPUs, round
robin) into that many NUMA nodes with QEMU's `-numa`.

KVM is used when the kernel really boots under it (tried once per kernel
and remembered); otherwise TCG with one host thread per vCPU.  Every sample
is labelled with the accelerator, because TCG timings are emulated and only
comparable with each other.  A panic, an oops, an OOM kill or a guest that
never answers is a failed trial carrying the console's tail, never a result.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mmlab import kernels
from mmlab.attribution import functions
from mmlab.attribution.guest import Instrumentation, guest_trace_record
from mmlab.errors import MmlabError
from mmlab.experiment import Arm, Plan
from mmlab.kernels import qemu_plugin
from mmlab.machine import probe
from mmlab.machine.knobs import DamonActors, HostSettings, parse_size
from mmlab.targets import LocalTarget, TrialError, TrialResult, initramfs
from mmlab.workloads import Workload, insns, mmwork
from mmlab.workloads.mmwork import TrialFailed
from mmlab.workloads.samples import Sample, parse_line

QEMU = "qemu-system-x86_64"
CMDLINE = "console=ttyS0 panic=-1 oops=panic loglevel=4 rdinit=/init"
CONSOLE_TAIL = 15
STARTED = "mmlab-guest: running trial"   # /init prints it before the trial
BOOT_RETRIES = 2
GUEST_TRACE_SAMPLES = 3  # one boot; several samples give compaction more chances to reach KSM pages
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
    kernel: kernels.Kernel
    vcpus: int = 1
    memory_mb: int = 1024
    extra_cmdline: str = ""
    timeout_s: float = 600
    numa_nodes: int = 1


class BootFailed(TrialFailed):
    """The guest died before /init started the trial: the boot failed, not the workload."""


def _accel_file(kernel: kernels.Kernel) -> Path:
    return Path(kernel.dir) / "accel.json"


def accelerator(kernel: kernels.Kernel, cache: Path) -> tuple[str, str]:
    """('kvm' or 'tcg', why): KVM only if this kernel boots and answers under it."""
    known = _accel_file(kernel)
    if known.exists():
        data = json.loads(known.read_text())
        return data["accel"], data["why"]
    if not Path("/dev/kvm").exists():
        accel, why = "tcg", "no /dev/kvm"
    else:
        try:
            out = _boot(Guest(kernel, timeout_s=30), "echo kvm-ok", "kvm", cache)
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


def _boot(guest: Guest, script: str, accel: str, cache: Path, swap: str | None = None,
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


NUMA_MARK = re.compile(r"^mmlab-guest: numa nodes (\d+)$", re.M)


def needs_modules(kernel: kernels.Kernel, swap: str | None) -> bool:
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


def swap_script(kernel: kernels.Kernel, swap: str | None) -> list[str]:
    """Lines of /trial.sh that give the guest the arm's swap: the kernel's
    modules loaded first when they are modules, then a zram device or the
    virtio disk made swap and turned on."""
    if not swap or swap == "none":
        return []
    lines = []
    if needs_modules(kernel, swap):
        lines += [f"insmod /lib/modules/mmlab/{m}.ko || true" for m in kernel.modules]
    kind, size = swap.split(":", 1)
    if kind == "zram":
        dev = "/dev/zram0"
        lines += ["[ -e /sys/block/zram0 ] || { echo 'mmlab: no zram device in the guest' >&2; "
                  "exit 97; }",
                  f"echo {parse_size(size)} > /sys/block/zram0/disksize"]
    else:
        dev = "/dev/vda"
        lines += ["for i in $(seq 100); do [ -b /dev/vda ] && break; sleep 0.1; done",
                  "[ -b /dev/vda ] || { echo 'mmlab: no virtio disk /dev/vda in the guest' >&2; "
                  "exit 97; }"]
    return lines + [f"mkswap {dev} > /dev/null", f"swapon {dev}"]


def trial_script(workload: Workload, params: dict[str, object], samples: int,
                 warmups: int | None, settings: HostSettings,
                 instrument: Instrumentation | None = None,
                 kernel: kernels.Kernel | None = None, after: tuple[str, ...] = ()) -> str:
    """The guest's /trial.sh: give it the arm's swap, apply the arm's
    settings, say how many NUMA nodes it has, then run mmwork (traced by
    `instrument`), then the lines `after`."""
    lines = ["set -e"]
    if settings.swap not in (None, "none"):
        if kernel is None:
            raise MmlabError(f"swap = {settings.swap}: a guest's swap needs its kernel")
        lines += swap_script(kernel, settings.swap)
    for knob, value in settings.fixed_files():
        lines.append(f"echo {shlex.quote(value)} > {shlex.quote(knob.path)}")
    if settings.damon == "off":
        lines += DamonActors.shell_off()
    lines.append('echo "mmlab-guest: numa nodes $(ls -d /sys/devices/system/node/node* '
                 '2>/dev/null | wc -l)" > /dev/ttyS0')
    command = shlex.join(mmwork.argv(workload, params, samples, warmups, binary="/bin/mmwork"))
    if not instrument and not after:
        lines.append("exec " + command)
        return "\n".join(lines) + "\n"
    lines += instrument.script_before() if instrument else []
    lines += ["set +e", command, "rc=$?"]
    lines += [*instrument.script_after(), *after] if instrument else list(after)
    return "\n".join(lines + ["exit $rc"]) + "\n"


def initramfs_cache() -> Path:
    return kernels.cache_dir().parent / "initramfs"


def run(guest: Guest, workload: Workload, params: dict[str, object], samples: int,
        warmups: int | None, settings: HostSettings, cache: Path | None = None,
        instrument: Instrumentation | None = None, plugin: Path | None = None) -> list[Sample]:
    """Boot `guest`, run one trial in it, and return its samples, labelled.

    With `instrument`, the trial runs traced and every sample says so
    (state `instrumented` = 1) and carries the trace figures in `counts`
    under `trace_*` names, covering the whole trial (warm-ups included).
    With `plugin` (TCG only), the instruction-counting plugin is loaded and
    its counts become the samples' instruction metrics (insns.from_plugin;
    insns.Unavailable when they cannot)."""
    cache = cache or initramfs_cache()
    accel, why = accelerator(guest.kernel, cache)
    plugin = plugin if accel == "tcg" else None     # a TCG plugin; KVM guests count with perf
    script = trial_script(workload, params, samples, warmups, settings, instrument, guest.kernel)
    boot, retry = _boot_retrying(guest, script, accel, cache, settings.swap,
                                 _programs(workload, params, cache), plugin)
    got, stderr = _samples(boot, guest, workload, samples)
    if plugin:
        insns.from_plugin(workload, got, boot.plugin_output)
    traced = Instrumentation.parse(stderr) if instrument else {}
    if instrument and not traced:
        raise TrialFailed(f"instrumentation produced nothing on {guest.kernel.name}: {stderr[-300:]}")
    numa = NUMA_MARK.search(boot.console)
    for s in got:
        s.counts.update(traced)
        s.state["instrumented"] = 1.0 if instrument else 0.0
        s.state.update({"target": "qemu", "accelerator": accel, "guest_kernel": guest.kernel.name,
                        "guest_kernel_package": guest.kernel.package_version or guest.kernel.version,
                        "guest_vcpus": float(guest.vcpus),
                        "guest_memory_mb": float(guest.memory_mb),
                        "guest_numa_nodes": float(numa.group(1)) if numa else float("nan"),
                        "boot_s": round(boot.seconds, 3), "boot_retries": float(retry)})
    return got


def _programs(workload: Workload, params: dict[str, object], cache: Path) -> tuple[Path, ...]:
    """The initramfs part holding an exec workload's program and libraries, if any."""
    packed = workload.programs(params)
    return (initramfs.files_archive(packed, cache),) if packed else ()


def _boot_retrying(guest: Guest, script: str, accel: str, cache: Path, swap: str | None,
                   archives: tuple[Path, ...], plugin: Path | None,
                   plugin_args: tuple[str, ...] = ()) -> tuple[BootResult, int]:
    """A boot and how many retries it took: tried again when the kernel
    failed before the trial began, the last failure raised."""
    for retry in range(BOOT_RETRIES):
        try:
            return _boot(guest, script, accel, cache, swap, archives, plugin, plugin_args), retry
        except BootFailed:
            continue
    return _boot(guest, script, accel, cache, swap, archives, plugin, plugin_args), BOOT_RETRIES


def _samples(boot: BootResult, guest: Guest, workload: Workload,
             samples: int) -> tuple[list[Sample], str]:
    """The samples mmwork printed in the guest, and its stderr; a failed
    workload or a missing sample is TrialFailed."""
    rc = int(boot.frames["rc"].strip())
    stderr = boot.frames["stderr"].decode(errors="replace").strip()
    if rc:
        last = stderr.splitlines()[-1] if stderr else f"exit status {rc}"
        raise TrialFailed(f"{workload.name} failed in the guest ({guest.kernel.name}): {last}")
    got = [workload.measured(parse_line(line))
           for line in boot.frames["stdout"].decode().splitlines() if line]
    if len(got) != samples:
        raise TrialFailed(f"{workload.name}: expected {samples} samples from the guest, "
                          f"got {len(got)}")
    return got, stderr


def count_functions(guest: Guest, workload: Workload, params: dict[str, object], samples: int,
                    warmups: int | None, settings: HostSettings, plugin: Path,
                    cache: Path | None = None) -> functions.FunctionInsns:
    """One TCG boot counting the kernel's instructions per function inside
    the timed windows (attribution/functions.py): the plugin with
    blocks=on, the workload with --insns, and the kernel's `_text` printed
    afterwards for the KASLR offset.  A kernel that runs under KVM here has
    no such counts (MmlabError)."""
    cache = cache or initramfs_cache()
    accel, why = accelerator(guest.kernel, cache)
    if accel != "tcg":
        raise MmlabError(f"{guest.kernel.name} runs under {accel} here ({why}); per-function "
                         "instruction counts come from the TCG plugin")
    symbols = kernel_symbols(guest, cache)
    script = trial_script(workload, insns.counting_params(params), samples, warmups, settings,
                          kernel=guest.kernel, after=functions.SCRIPT_AFTER)
    boot, _ = _boot_retrying(guest, script, accel, cache, settings.swap,
                             _programs(workload, params, cache), plugin, ("blocks=on",))
    got, stderr = _samples(boot, guest, workload, samples)
    return functions.attribute(workload, got, boot.plugin_output, stderr, symbols,
                               guest.kernel.version)


def kernel_symbols(guest: Guest, cache: Path) -> Path:
    """The kernel's text symbols: kept with the kernel (a build's System.map),
    or read from its /proc/kallsyms in one boot (about 1 MB over the serial
    port, 5-10 s) and kept from then on."""
    if not guest.kernel.symbols.exists():
        dumped = run_script(guest, functions.DUMP_SCRIPT, cache=cache)
        try:
            guest.kernel.keep_symbols(gzip.decompress(base64.b64decode(dumped)))
        except (ValueError, OSError, EOFError) as exc:
            raise MmlabError(f"{guest.kernel.name}: /proc/kallsyms arrived unreadable: "
                             f"{exc}") from exc
    return guest.kernel.symbols


def run_script(guest: Guest, script: str, archives: tuple[Path, ...] = (),
               cache: Path | None = None) -> str:
    """The stdout of `script` run as the guest's /trial.sh in one boot, with
    no mmwork around it: a peer tool run as it is, to set beside mmlab's
    trial of it (bench.py's agreement part).  A non-zero exit is TrialFailed."""
    cache = cache or initramfs_cache()
    accel, _ = accelerator(guest.kernel, cache)
    boot = _boot(guest, script, accel, cache, None, archives)
    if int(boot.frames["rc"].strip()):
        raise TrialFailed(f"script failed in the guest ({guest.kernel.name}): "
                          f"{boot.frames['stderr'].decode(errors='replace').strip()[-200:]}")
    return boot.frames["stdout"].decode(errors="replace")


def qemu_version() -> str:
    proc = subprocess.run([QEMU, "--version"], capture_output=True, text=True)
    return proc.stdout.splitlines()[0] if proc.returncode == 0 else "not installed"


def guest_environment(guest: Guest, accel: str, why: str,
                      swap: str | None = None) -> dict[str, object]:
    """What the trial ran on; `swap` replaces the host's swap areas in the
    environment, since the guest's are the ones its trial saw."""
    k = guest.kernel
    return {"target": "qemu", "guest_kernel": k.name, "guest_kernel_version": k.version,
            "guest_kernel_source": k.source, "guest_kernel_package_version": k.package_version,
            "guest_kernel_suite": k.suite, "guest_kernel_flavour": k.flavour,
            "guest_kernel_packaging": k.packaging, "guest_config_sha256": k.config_sha256,
            "accelerator": accel, "accelerator_why": why, "vcpus": guest.vcpus,
            "memory_mb": guest.memory_mb, "numa_nodes": guest.numa_nodes,
            "swap": [] if not swap or swap == "none" else
            ["/dev/zram0" if swap.startswith("zram:") else "/dev/vda (virtio disk)"],
            "guest_swap": swap or "none",
            "qemu": qemu_version(), "cmdline": f"{CMDLINE} {guest.extra_cmdline}".strip()}


class QemuTarget(LocalTarget):
    """One guest kernel: each trial is one boot, the arm's settings written
    by the guest's /trial.sh, so nothing on the host changes.  The kernel is
    fetched (Debian) or looked up (local, build) once; if that fails, every
    trial of this target fails with the reason."""

    def __init__(self, kernel: str, say: Callable[[str], None] = print):
        self.name = f"qemu:{kernel}"
        self.kernel_name = kernel
        self.say = say
        self._kernel: kernels.Kernel | MmlabError | None = None

    def kernel(self) -> kernels.Kernel:
        if self._kernel is None:
            try:
                self._kernel = kernels.get(self.kernel_name)
                if self._kernel.name.startswith("debian:") and \
                        self._kernel.format < kernels.FORMAT:
                    raise MmlabError("cached by an older mmlab")
            except MmlabError as missing:
                self._kernel = missing
                if self.kernel_name.startswith("debian:"):
                    self.say(f"fetching kernel {self.kernel_name} (apt-get download)")
                    try:
                        self._kernel = kernels.ensure(self.kernel_name)
                    except MmlabError as exc:
                        self._kernel = exc
        if isinstance(self._kernel, MmlabError):
            raise self._kernel
        return self._kernel

    def check(self, plan: Plan) -> None:
        """Guests change only their own disposable kernel: nothing to consent
        to.  The kernel is made ready now, before the first trial."""
        try:
            self.kernel()
        except MmlabError as exc:
            self.say(f"{self.name}: {exc}; its trials will fail")

    def guest(self, arm: Arm, plan: Plan) -> Guest:
        return Guest(self.kernel(), vcpus=int(arm.cpus or 1), memory_mb=arm.memory_mb,
                     extra_cmdline=plan.profile.cmdline, timeout_s=plan.profile.timeout_s,
                     numa_nodes=getattr(arm, "numa_nodes", 1) or 1)

    def run_trial(self, arm: Arm, plan: Plan) -> TrialResult:
        guest = self.guest(arm, plan)
        accel, why = accelerator(guest.kernel, initramfs_cache())
        env = {**probe.environment(), **guest_environment(guest, accel, why, arm.settings.swap)}
        try:
            samples = run(guest, plan.workload, arm.params, plan.profile.samples_per_trial,
                          plan.profile.warmups, arm.settings)
            if insns.wanted(plan.workload, plan.profile.metrics):
                insns.add_counts(samples, plan.workload,
                                 lambda: self._counting_pass(guest, accel, arm, plan))
        except MmlabError as exc:
            raise TrialError(str(exc), env) from exc
        return TrialResult(samples, env)

    def _counting_pass(self, guest: Guest, accel: str, arm: Arm, plan: Plan) -> list[Sample]:
        """The trial again, in a boot of its own, counting instructions: under
        TCG with mmlab's plugin, under KVM with the guest's vPMU (if any)."""
        plugin = None
        if accel == "tcg":
            try:
                plugin = qemu_plugin.ensure()
            except MmlabError as exc:
                raise insns.Unavailable(f"no QEMU plugin: {exc}") from exc
        return run(guest, plan.workload, insns.counting_params(arm.params),
                   plan.profile.samples_per_trial, plan.profile.warmups, arm.settings,
                   plugin=plugin)

    def attribute(self, arm: Arm, plan: Plan) -> dict[str, dict]:
        """One instrumented boot of GUEST_TRACE_SAMPLES samples: calls of the
        profile's `trace_count` functions and call times of its `trace_time`
        ones (default: the workload's declared mm paths, timing the first).
        Under TCG a second boot counts the kernel's instructions per function
        in the timed windows (a trial of the profile's size)."""
        wl = plan.workload
        count = tuple(plan.profile.trace_count) or wl.mm_paths
        time_ = tuple(plan.profile.trace_time) or wl.mm_paths[:1]
        guest = self.guest(arm, plan)
        got = run(guest, wl, arm.params, samples=GUEST_TRACE_SAMPLES, warmups=0,
                  settings=arm.settings, instrument=Instrumentation(count, time_))
        found = {"guest_trace": guest_trace_record(got)}
        counted = self._functions(guest, arm, plan)
        if counted:
            found["functions"] = counted.model_dump()
        return found

    def _functions(self, guest: Guest, arm: Arm, plan: Plan) -> functions.FunctionInsns | None:
        """Kernel instructions per function in the timed windows, where the
        guest runs under TCG and mmlab's plugin builds; otherwise the reason
        is said and there are none."""
        if not plan.workload.windows:
            return None
        try:
            return count_functions(guest, plan.workload, arm.params,
                                   plan.profile.samples_per_trial, plan.profile.warmups,
                                   arm.settings, qemu_plugin.ensure())
        except MmlabError as exc:
            self.say(f"{arm.name}: no per-function instruction counts: {exc}")
            return None
