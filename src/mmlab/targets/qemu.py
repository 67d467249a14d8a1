"""Run a workload on another kernel, booted in QEMU.

The guest has no disk and no network: `-kernel` and `-initrd` only, the
console on ttyS0 (kept as a log) and the results on ttyS1, where /init
frames stdout, stderr and the exit status with a SHA-256 each.  One boot
runs one trial: its warm-ups and all its samples, so boot time stays out of
the measurements.

KVM is used when the kernel really boots under it (tried once per kernel
and remembered); otherwise TCG with one host thread per vCPU.  Every sample
is labelled with the accelerator, because TCG timings are emulated and only
comparable with each other.  A panic, an oops, an OOM kill or a guest that
never answers is a failed trial carrying the console's tail, never a result.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shlex
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .. import kernels
from ..errors import MmlabError
from ..knobs import HostSettings
from ..samples import Sample, parse_line
from ..workloads import Workload
from . import initramfs
from .host import TrialFailed

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
class Instrumentation:
    """In-guest tracing for attribution runs, never for clean timing runs.

    `count`: functions whose calls are counted (a kprobe each, summed by a
    hist trigger).  `time`: functions whose every call is timed by the
    function_graph tracer (count, total and longest, in microseconds)."""
    count: tuple[str, ...] = ()
    time: tuple[str, ...] = ()

    def script_before(self) -> list[str]:
        t = "/sys/kernel/tracing"
        lines = [f"echo 0 > {t}/tracing_on", f"echo 65536 > {t}/buffer_size_kb"]
        for f in self.count:
            q = shlex.quote(f)
            # A trigger on a disabled event runs in "soft" mode: counted by the
            # hist, never written to the ring buffer the timings are read from.
            # A function this kernel lacks (or blacklists for kprobes) is skipped.
            lines += [f"{{ echo 'p:mmlab/{f} {f}' >> {t}/kprobe_events && "
                      f"echo 'hist:keys=common_pid:vals=hitcount' > {t}/events/mmlab/{q}/trigger; }}"
                      f" 2>/dev/null || echo 'SKIP {f}' >&2"]
        if self.time:
            lines += [f"echo {shlex.quote(f)} >> {t}/set_ftrace_filter 2>/dev/null || "
                      f"echo 'SKIP {f}' >&2" for f in self.time]
            lines += [f"echo function_graph > {t}/current_tracer"]
        return lines + [f"echo 1 > {t}/tracing_on"]

    def script_after(self) -> list[str]:
        t = "/sys/kernel/tracing"
        lines = [f"echo 0 > {t}/tracing_on"]
        for f in self.count:
            q = shlex.quote(f)
            lines.append(f"[ -e {t}/events/mmlab/{q}/hist ] && echo \"COUNT {f} "
                         f"$(grep -o 'hitcount: *[0-9]*' {t}/events/mmlab/{q}/hist | "
                         "awk '{s+=$2} END {print s+0}')\" >&2 || true")
        if self.time:
            # function_graph lines end in "| name();" with the duration and its unit before.
            lines.append(
                f"awk '/\\(\\);/ {{ for (i = 1; i <= NF; i++) if ($i ~ /^(us|ms|s)$/) {{ "
                "v = $(i-1); u = $i; f = $NF; sub(/\\(\\);/, \"\", f); "
                "m = (u == \"ms\") ? 1000 : (u == \"s\") ? 1000000 : 1; v *= m; "
                "n[f]++; s[f] += v; if (v > x[f]) x[f] = v } } "
                "END { for (f in n) printf \"TIME %s %d %.3f %.3f\\n\", f, n[f], s[f], x[f] }' "
                f"{t}/trace >&2")
        return lines

    @staticmethod
    def parse(stderr: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for line in stderr.splitlines():
            f = line.split()
            if len(f) == 3 and f[0] == "COUNT":
                out[f"trace_calls.{f[1]}"] = float(f[2])
            elif len(f) == 2 and f[0] == "SKIP":
                out[f"trace_skipped.{f[1]}"] = 1.0
            elif len(f) == 5 and f[0] == "TIME":
                out[f"trace_timed_calls.{f[1]}"] = float(f[2])
                out[f"trace_total_us.{f[1]}"] = float(f[3])
                out[f"trace_max_us.{f[1]}"] = float(f[4])
        return out


@dataclass(frozen=True)
class Guest:
    """What a trial's VM looks like."""
    kernel: kernels.Kernel
    vcpus: int = 1
    memory_mb: int = 1024
    extra_cmdline: str = ""
    timeout_s: float = 600


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


def _qemu_argv(guest: Guest, initrd: Path, accel: str, console: Path, results: Path) -> list[str]:
    accel_args = (["-accel", "kvm", "-cpu", "host"] if accel == "kvm"
                  else ["-accel", "tcg,thread=multi", "-cpu", "max"])
    return [QEMU, "-machine", "pc", *accel_args, "-smp", str(guest.vcpus),
            "-m", str(guest.memory_mb), "-kernel", str(guest.kernel.image),
            "-initrd", str(initrd), "-append", f"{CMDLINE} {guest.extra_cmdline}".strip(),
            "-display", "none", "-nodefaults", "-no-reboot",
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


def _boot(guest: Guest, script: str, accel: str, cache: Path) -> BootResult:
    with tempfile.TemporaryDirectory(prefix="mmlab-guest-") as tmp:
        tmpd = Path(tmp)
        initrd = initramfs.trial_initrd(initramfs.base_archive(cache), script, tmpd / "initrd")
        console, results = tmpd / "console.log", tmpd / "results.log"
        argv = _qemu_argv(guest, initrd, accel, console, results)
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
    return BootResult(frames, text, seconds)


def trial_script(workload: Workload, params: dict[str, object], samples: int,
                 warmups: int | None, settings: HostSettings,
                 instrument: Instrumentation | None = None) -> str:
    """The guest's /trial.sh: apply the arm's settings, then run mmwork."""
    lines = ["set -e"]
    for path, value in settings.files():
        lines.append(f"echo {shlex.quote(value)} > {shlex.quote(path)}")
    if settings.swap not in (None, "none"):
        raise MmlabError(f"swap = {settings.swap}: guests have no swap device yet "
                         "(only swap = none runs in QEMU)")
    argv = ["/bin/mmwork", workload.name, *workload.args(params), "--samples", str(samples)]
    if warmups is not None:
        argv += ["--warmups", str(warmups)]
    command = " ".join(shlex.quote(a) for a in argv)
    if not instrument:
        lines.append("exec " + command)
        return "\n".join(lines) + "\n"
    lines += instrument.script_before()
    lines += [command, "rc=$?"] + instrument.script_after() + ["exit $rc"]
    return "\n".join(lines) + "\n"


def initramfs_cache() -> Path:
    return kernels.cache_dir().parent / "initramfs"


def run(guest: Guest, workload: Workload, params: dict[str, object], samples: int,
        warmups: int | None, settings: HostSettings, cache: Path | None = None,
        instrument: Instrumentation | None = None) -> list[Sample]:
    """Boot `guest`, run one trial in it, and return its samples, labelled.

    With `instrument`, the trial runs traced and every sample says so
    (state `instrumented` = 1) and carries the trace figures in `counts`
    under `trace_*` names, covering the whole trial (warm-ups included)."""
    cache = cache or initramfs_cache()
    accel, why = accelerator(guest.kernel, cache)
    script = trial_script(workload, params, samples, warmups, settings, instrument)
    for retry in range(BOOT_RETRIES + 1):
        try:
            boot = _boot(guest, script, accel, cache)
            break
        except BootFailed:
            if retry == BOOT_RETRIES:
                raise
    rc = int(boot.frames["rc"].strip())
    stderr = boot.frames["stderr"].decode(errors="replace").strip()
    if rc:
        last = stderr.splitlines()[-1] if stderr else f"exit status {rc}"
        raise TrialFailed(f"{workload.name} failed in the guest ({guest.kernel.name}): {last}")
    got = [parse_line(line) for line in boot.frames["stdout"].decode().splitlines() if line]
    if len(got) != samples:
        raise TrialFailed(f"{workload.name}: expected {samples} samples from the guest, "
                          f"got {len(got)}")
    traced = Instrumentation.parse(stderr) if instrument else {}
    if instrument and not traced:
        raise TrialFailed(f"instrumentation produced nothing on {guest.kernel.name}: {stderr[-300:]}")
    for s in got:
        s.counts.update(traced)
        s.state["instrumented"] = 1.0 if instrument else 0.0
        s.state.update({"target": "qemu", "accelerator": accel, "guest_kernel": guest.kernel.name,
                        "guest_vcpus": float(guest.vcpus),
                        "guest_memory_mb": float(guest.memory_mb),
                        "boot_s": round(boot.seconds, 3), "boot_retries": float(retry)})
    return got


def qemu_version() -> str:
    proc = subprocess.run([QEMU, "--version"], capture_output=True, text=True)
    return proc.stdout.splitlines()[0] if proc.returncode == 0 else "not installed"


def guest_environment(guest: Guest, accel: str, why: str) -> dict[str, object]:
    return {"target": "qemu", "guest_kernel": guest.kernel.name,
            "guest_kernel_version": guest.kernel.version, "guest_kernel_source": guest.kernel.source,
            "guest_config_sha256": guest.kernel.config_sha256, "accelerator": accel,
            "accelerator_why": why, "vcpus": guest.vcpus, "memory_mb": guest.memory_mb,
            "qemu": qemu_version(), "cmdline": f"{CMDLINE} {guest.extra_cmdline}".strip()}
