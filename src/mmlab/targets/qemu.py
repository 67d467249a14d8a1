"""Run a workload on another kernel, booted in QEMU (boot.py): one boot runs
one trial, its warm-ups and all its samples, so boot time stays out of the
measurements.

Swap in a guest is the arm's `swap`: `zram:SIZE` is a zram device of the
guest's own kernel, `file:SIZE` a virtio disk of SIZE (a sparse file on the
host) used whole as the guest's swap device.  The kernel's own modules
(zram, its compressors, virtio_blk) go into the initramfs when they are
modules.  `numa_nodes` splits the guest's memory (and its vCPUs, round
robin) into that many NUMA nodes with QEMU's `-numa`.

A workload with `scratch_disk` (reclaim: a file whose page cache reclaim
must be able to drop) gets a disk-backed filesystem at the guest's /var/tmp,
which is otherwise the initramfs's tmpfs: a zram disk, made ext2 by
busybox's mke2fs and mounted by the kernel's ext4.

Every sample is labelled with the accelerator (KVM or TCG), because TCG
timings are emulated and only comparable with each other.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from mmlab.attribution import functions
from mmlab.attribution.guest import Instrumentation, guest_trace_record
from mmlab.errors import MmlabError
from mmlab.experiment.plan import Arm, Plan
from mmlab.kernels import images, qemu_plugin
from mmlab.machine.knobs import DamonActors, HostSettings, Journal, apply, parse_size
from mmlab.targets import (
    LocalTarget,
    TrialError,
    TrialResult,
    initramfs,
    kvm,
    probe,
    snapshot,
    stays,
)
from mmlab.targets.boot import (
    CMDLINE,
    BootResult,
    Guest,
    accelerator,
    boot_retrying,
    default_lines,
    end_guests,
    initramfs_cache,
    is_module,
    kernel_defaults,
    needs_modules,
    qemu_version,
)
from mmlab.targets.host import consented, refuse
from mmlab.workloads import Workload, insns, mmwork, syscalls
from mmlab.workloads.mmwork import TrialFailed
from mmlab.workloads.samples import Sample, parse_line

GUEST_TRACE_SAMPLES = 3  # one boot; several samples give compaction more chances to reach KSM pages
NUMA_MARK = re.compile(r"^mmlab-guest: numa nodes (\d+)$", re.M)
SCRATCH_DIR = "/var/tmp"   # mmwork's --dir by default


def swap_script(kernel: images.Kernel, swap: str | None) -> list[str]:
    """Lines of /trial.sh that give the guest the arm's swap: the kernel's
    modules loaded first when they are modules, then a zram device or the
    virtio disk made swap and turned on."""
    if not swap or swap == "none":
        return []
    lines = module_lines(kernel) if needs_modules(kernel, swap) else []
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


def module_lines(kernel: images.Kernel) -> list[str]:
    """Lines of /trial.sh loading the kernel's stored modules (the modules
    archive, initramfs.modules_archive), those built in failing harmlessly."""
    return [f"insmod /lib/modules/mmlab/{m}.ko || true" for m in kernel.modules]


def scratch_modules(kernel: images.Kernel, swap: str | None) -> bool:
    """Must the trial bring the kernel's modules for a scratch disk: zram is
    a module, and the swap does not bring them already?"""
    return (is_module(kernel, "CONFIG_ZRAM", "a scratch disk for the workload's files")
            and not needs_modules(kernel, swap))


def scratch_script(kernel: images.Kernel, swap: str | None) -> list[str]:
    """Lines of /trial.sh putting /var/tmp on a disk-backed filesystem: a zram
    disk (its own, after the swap's) of twice the guest's memory, which
    costs the guest its table (about 1% of its memory) and what is written
    to it (a file of one repeated byte, as mmwork writes them, takes
    nothing), made ext2 and mounted as ext4."""
    lines = module_lines(kernel) if scratch_modules(kernel, swap) else []
    return lines + [
        "[ -e /sys/class/zram-control/hot_add ] || { echo 'mmlab: no zram in the guest for "
        "a scratch disk' >&2; exit 97; }",
        "zram=zram$(cat /sys/class/zram-control/hot_add)",
        "echo $(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) * 2))K "
        "> /sys/block/$zram/disksize",
        "mke2fs -q -b 4096 /dev/$zram > /dev/null",   # zram's blocks are 4 KiB
        f"mount -t ext4 /dev/$zram {SCRATCH_DIR}"]


def trial_script(workload: Workload, params: Mapping[str, object], samples: int,
                 warmups: int | None, settings: HostSettings,
                 instrument: Instrumentation | None = None,
                 kernel: images.Kernel | None = None, after: tuple[str, ...] = (),
                 before: tuple[str, ...] = ()) -> str:
    """The guest's /trial.sh: the lines `before`, the kernel's THP defaults,
    the arm's swap and the workload's scratch disk, the arm's settings, its
    NUMA nodes and min_free_kbytes, then mmwork (traced by `instrument`),
    then the lines `after`."""
    lines = ["set -e", *before, *default_lines("boot")]
    if settings.swap not in (None, "none"):
        if kernel is None:
            raise MmlabError(f"swap = {settings.swap}: a guest's swap needs its kernel")
        lines += swap_script(kernel, settings.swap)
    if workload.scratch_disk:
        if kernel is None:
            raise MmlabError(f"{workload.name}: a guest's scratch disk needs its kernel")
        lines += scratch_script(kernel, settings.swap)
    for knob, value in settings.fixed_files():
        lines.append(f"echo {shlex.quote(value)} > {shlex.quote(knob.path)}")
    if settings.damon == "off":
        lines += DamonActors.shell_off()
    lines += ['echo "mmlab-guest: numa nodes $(ls -d /sys/devices/system/node/node* '
              '2>/dev/null | wc -l)" > /dev/ttyS0', *default_lines("set")]
    command = shlex.join(mmwork.argv(workload, params, samples, warmups, binary="/bin/mmwork"))
    if not instrument and not after:
        lines.append("exec " + command)
        return "\n".join(lines) + "\n"
    lines += instrument.script_before() if instrument else []
    lines += ["set +e", command, "rc=$?"]
    lines += [*instrument.script_after(), *after] if instrument else list(after)
    return "\n".join(lines + ["exit $rc"]) + "\n"


def sample(guest: Guest, workload: Workload, params: Mapping[str, object], samples: int,
           warmups: int | None, settings: HostSettings, cache: Path | None = None,
           instrument: Instrumentation | None = None, plugin: Path | None = None,
           say: Callable[[str], None] | None = None,
           plugin_extra: tuple[str, ...] = ()) -> list[Sample]:
    """Start `guest` (restored or booted), run one trial in it, and return
    its samples, labelled; `say` hears why a guest meant to be restored
    had to boot.

    With `instrument`, the trial runs traced and every sample says so
    (state `instrumented` = 1) and carries the trace figures in `counts`
    under `trace_*` names, covering the whole trial (warm-ups included).
    With `plugin` (TCG only), the instruction-counting plugin is loaded and
    its counts become the samples' instruction metrics (insns.from_plugin;
    insns.Unavailable when they cannot), with `plugin_extra` (stays=: per
    syscall, and calls=: inclusive per path, stays.from_plugin)."""
    cache = cache or initramfs_cache()
    accel, why = accelerator(guest.kernel, cache)
    plugin = plugin if accel == "tcg" else None     # a TCG plugin; KVM guests count with perf
    script = trial_script(workload, params, samples, warmups, settings, instrument, guest.kernel)
    archives = _archives(workload, params, guest.kernel, settings.swap, cache)
    boot, retry = start(guest, script, accel, cache, settings.swap, archives, plugin, plugin_extra)
    if boot.why_booted and say:
        say(f"{guest.kernel.name}: booting every trial: {boot.why_booted}")
    got, stderr = guest_samples(boot, guest, workload, samples)
    if plugin:
        insns.from_plugin(workload, got, boot.plugin_output, qemu_plugin.build(plugin))
        stays.from_plugin(guest, cache, workload, got, boot.plugin_output)
    traced = Instrumentation.parse(stderr) if instrument else {}
    if instrument and not traced:
        raise TrialFailed(f"instrumentation produced nothing on {guest.kernel.name}: "
                          f"{stderr[-300:]}")
    numa = NUMA_MARK.search(boot.console)
    for s in got:
        s.counts.update(traced)
        s.state["instrumented"] = 1.0 if instrument else 0.0
        s.state.update({"target": "qemu", "accelerator": accel, "accelerator_why": why,
                        "guest_kernel": guest.kernel.name,
                        "guest_kernel_package": (guest.kernel.package_version
                                                 or guest.kernel.version),
                        "guest_vcpus": float(guest.vcpus),
                        "guest_memory_mb": float(guest.memory_mb),
                        "guest_numa_nodes": float(numa.group(1)) if numa else float("nan"),
                        "boot_s": round(boot.seconds, 3), "boot_retries": float(retry),
                        **boot.labels(), **kernel_defaults(boot.console)})
    return got


def start(guest: Guest, script: str, accel: str, cache: Path, swap: str | None,
          archives: tuple[Path, ...], plugin: Path | None,
          plugin_extra: tuple[str, ...] = ()) -> tuple[BootResult, int]:
    """The trial's guest, run to the end, and how many starts it retried:
    restored from its snapshot (made on first use) when the guest starts
    that way, booted otherwise, or when no snapshot can be made (the
    result's `start` says which; `why_booted` says why)."""
    if guest.start == "snapshot":
        try:
            return snapshot.restored(guest, script, accel, cache, swap, archives, plugin,
                                     plugin_extra)
        except snapshot.SnapshotUnavailable as exc:
            boot, retry = boot_retrying(guest, script, accel, cache, swap, archives, plugin,
                                        plugin_extra)
            boot.why_booted = str(exc)
            return boot, retry
    return boot_retrying(guest, script, accel, cache, swap, archives, plugin, plugin_extra)


def _archives(workload: Workload, params: Mapping[str, object], kernel: images.Kernel,
              swap: str | None, cache: Path) -> tuple[Path, ...]:
    """The initramfs parts the trial adds: the kernel's modules for a scratch
    disk (when its swap does not bring them), an exec workload's program and
    libraries."""
    mods = workload.scratch_disk and scratch_modules(kernel, swap)
    packed = workload.programs(params)
    return (((initramfs.modules_archive(kernel),) if mods else ())
            + ((initramfs.files_archive(packed, cache),) if packed else ()))


def guest_samples(boot: BootResult, guest: Guest, workload: Workload,
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


def count_functions(guest: Guest, workload: Workload, params: Mapping[str, object], samples: int,
                    warmups: int | None, settings: HostSettings, plugin: Path,
                    cache: Path | None = None) -> functions.FunctionInsns:
    """One TCG boot counting the kernel's instructions per function inside
    the timed windows (attribution/functions.py): the plugin with blocks=on,
    stays= and calls= (inclusive), the workload with --insns, and the
    kernel's `_text` printed afterwards for the KASLR offset.  A kernel that
    runs under KVM here has no such counts (MmlabError)."""
    cache = cache or initramfs_cache()
    accel, why = accelerator(guest.kernel, cache)
    if accel != "tcg":
        raise MmlabError(f"{guest.kernel.name} runs under {accel} here ({why}); per-function "
                         "instruction counts come from the TCG plugin")
    symbols = stays.kernel_symbols(guest, cache)
    script = trial_script(workload, insns.counting_params(params), samples, warmups, settings,
                          kernel=guest.kernel, after=functions.SCRIPT_AFTER)
    boot, _ = start(guest, script, accel, cache, settings.swap,
                    _archives(workload, params, guest.kernel, settings.swap, cache), plugin,
                    ("blocks=on", *stays.plugin_args(guest, cache), *functions.calls_args(symbols)))
    got, stderr = guest_samples(boot, guest, workload, samples)
    return functions.attribute(workload, got, boot.plugin_output, stderr, symbols,
                               guest.kernel.version)


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
            "vcpu_pinning": "one host CPU each, QEMU's other threads apart" if accel == "kvm"
            else "none (TCG: vCPUs are emulation threads)",
            "guest_memory_backing": kvm.memory(guest.memory_mb, guest.numa_nodes)
            if accel == "kvm" else "QEMU's own (TCG)",
            "memory_mb": guest.memory_mb, "numa_nodes": guest.numa_nodes,
            "swap": [] if not swap or swap == "none" else
            ["/dev/zram0" if swap.startswith("zram:") else "/dev/vda (virtio disk)"],
            "guest_swap": swap or "none",
            "qemu": qemu_version(), "cmdline": f"{CMDLINE} {guest.extra_cmdline}".strip()}


class QemuTarget(LocalTarget):
    """One guest kernel: each trial is one boot, the arm's settings written
    by the guest's /trial.sh, so nothing on the host changes but the CPU
    clock an arm asks for (governor, turbo): a guest's vCPUs run at its
    host's clock, which the guest cannot set, so it is set on the host like
    a host arm's settings.  The kernel is fetched (Debian) or looked up
    (local, build) once; if that fails, every trial of this target fails
    with the reason."""

    def __init__(self, kernel: str, say: Callable[[str], None] = print,
                 allow_changes: bool = False):
        self.name = f"qemu:{kernel}"
        self.kernel_name = kernel
        self.say = say
        self.allow_changes = allow_changes
        self.journal = Journal()
        self._kernel: images.Kernel | MmlabError | None = None
        self._said: set[str] = set()

    def _once(self, line: str) -> None:
        """Say `line` the first time only: a reason that holds for every trial."""
        if line not in self._said:
            self._said.add(line)
            self.say(line)

    def kernel(self) -> images.Kernel:
        if self._kernel is None:
            self._kernel = images.ready(self.kernel_name, self.say)
        if isinstance(self._kernel, MmlabError):
            raise self._kernel
        return self._kernel

    def check(self, plan: Plan) -> None:
        """A host CPU clock an arm asks for is refused as a host arm's would
        be (no cpufreq here, no consent); the rest a guest changes in its
        own disposable kernel.  The kernel is made ready now, before the
        first trial; one nothing can fetch (local, build) is refused."""
        for arm in plan.arms:
            if arm.target == self.name and (clock := arm.settings.clock()):
                refuse(arm, clock, consented(plan, self.allow_changes))
        images.fetchable(self.kernel_name)
        try:
            self.kernel()
        except MmlabError as exc:
            self._once(f"{self.name}: {exc}; its trials will fail")

    def side_by_side(self, plan: Plan) -> int:
        """A plan that judges instruction counts alone runs as many trials at
        once as the cores it may use hold their vCPUs: under TCG the plugin
        counts each guest's own instructions, which a guest beside it cannot
        change (only its clock, and so the timer ticks that land in a window:
        within the counts' noise, docs/instructions.md); a timed plan, or
        KVM's pinned vCPUs, run one at a time, and so do arms that set the
        host's CPU clock (the journal's sessions do not nest across threads)."""
        return self._tcg_width(plan) if insns.only(plan.workload, plan.profile.metrics) else 1

    def counting_side_by_side(self, plan: Plan) -> int:
        """A timed plan that counts too runs its counting passes (their own
        boots) that many at once, for the reason `side_by_side` gives, once
        their trials' timing boots have run one at a time."""
        timed_and_counted = insns.wanted(plan.workload, plan.profile.metrics) and \
            not insns.only(plan.workload, plan.profile.metrics)
        return self._tcg_width(plan) if timed_and_counted else 1

    def attribution_side_by_side(self, plan: Plan) -> int:
        """Attribution that counts instructions by function alone (no guest
        trace, which times calls) runs its arms' counting boots at once."""
        alone = set(plan.profile.attribution) - {"state_functions"} == {"functions"}
        return self._tcg_width(plan) if alone else 1

    def _tcg_width(self, plan: Plan) -> int:
        """The cores this process may use over the plan's vCPUs under TCG;
        one under KVM, or when an arm sets the host's CPU clock."""
        if any(a.settings.clock() for a in plan.arms):
            return 1
        try:
            accel, _ = accelerator(self.kernel(), initramfs_cache())
        except MmlabError:
            return 1
        vcpus = max(int(a.cpus or 1) for a in plan.arms)
        return max(1, len(os.sched_getaffinity(0)) // vcpus) if accel == "tcg" else 1

    def stop(self) -> None:
        end_guests()

    def guest(self, arm: Arm, plan: Plan, state: int = 0) -> Guest:
        return Guest(self.kernel(), vcpus=int(arm.cpus or 1), memory_mb=arm.memory_mb,
                     extra_cmdline=plan.profile.cmdline, timeout_s=plan.profile.timeout_s,
                     numa_nodes=arm.numa_nodes or 1, start=arm.guest_start, state=state)

    @contextmanager
    def _host_clock(self, arm: Arm, plan: Plan) -> Iterator[None]:
        """The arm's CPU clock set on the host for the block, journaled and
        restored as a host arm's settings are; for an arm that sets none,
        nothing (not even the machine lock: guests run side by side)."""
        clock = arm.settings.clock()
        if clock is None:
            yield
            return
        with self.journal.session():
            apply(clock, self.journal, consented(plan, self.allow_changes))
            yield

    def run_trial(self, arm: Arm, plan: Plan) -> TrialResult:
        with self._host_clock(arm, plan):
            return self._passes(arm, plan)()

    def timed_pass(self, arm: Arm, plan: Plan) -> Callable[[], TrialResult]:
        """The timing boot now; the counting boot when the result is called
        (never with a CPU clock to hold: `counting_side_by_side` is then one)."""
        return self._passes(arm, plan)

    def _passes(self, arm: Arm, plan: Plan) -> Callable[[], TrialResult]:
        """The trial's timing boot, run now (none for a plan judged on counts
        alone), and what runs its counting boot, if the plan counts, and
        gives the trial's result."""
        guest = self.guest(arm, plan, snapshot.rotation(arm, plan))
        accel, why = accelerator(guest.kernel, initramfs_cache())
        env = {**probe.environment(), **guest_environment(guest, accel, why, arm.settings.swap)}
        if insns.only(plan.workload, plan.profile.metrics):
            return self._failing_as_trial(env, lambda: insns.alone(
                self._counting_pass(guest, accel, arm, plan), plan.workload))
        try:
            samples = sample(guest, plan.workload, arm.params, plan.profile.samples_per_trial,
                             plan.profile.warmups, arm.settings, say=self._once)
        except MmlabError as exc:
            raise TrialError(str(exc), env) from exc

        def counted() -> list[Sample]:
            if insns.wanted(plan.workload, plan.profile.metrics):
                insns.add_counts(samples, plan.workload,
                                 lambda: self._counting_pass(guest, accel, arm, plan))
            return samples
        return self._failing_as_trial(env, counted)

    @staticmethod
    def _failing_as_trial(env: dict, run: Callable[[], list[Sample]]) -> Callable[[], TrialResult]:
        """`run` as a trial's result in `env`, its failure a TrialError there."""
        def result() -> TrialResult:
            try:
                return TrialResult(run(), env)
            except MmlabError as exc:
                raise TrialError(str(exc), env) from exc
        return result

    def _counting_pass(self, guest: Guest, accel: str, arm: Arm, plan: Plan) -> list[Sample]:
        """The trial again, in a boot of its own, counting instructions: under
        TCG with mmlab's plugin (per syscall and path, and events, too when the
        profile names such a metric), under KVM with the guest's vPMU (if any)."""
        plugin = None
        if accel == "tcg":
            try:
                plugin = qemu_plugin.ensure()
            except MmlabError as exc:
                raise insns.Unavailable(f"no QEMU plugin: {exc}") from exc
        extra = stays.counting_args(guest, initramfs_cache(), plan.profile.metrics) \
            if plugin and syscalls.wanted(plan.workload, plan.profile.metrics) else ()
        if plugin:      # events beside them: only those asked for, they cost
            extra += insns.events_arg(plan.workload, plan.profile.metrics)
        return sample(guest, plan.workload, insns.counting_params(arm.params),
                   plan.profile.samples_per_trial, plan.profile.warmups, arm.settings,
                   plugin=plugin, say=self._once, plugin_extra=extra)

    def attribute(self, arm: Arm, plan: Plan) -> dict[str, dict]:
        """One instrumented boot of GUEST_TRACE_SAMPLES samples: calls of the
        profile's `trace_count` functions and call times of its `trace_time`
        ones (default: the workload's declared mm paths, timing the first).
        Under TCG a second boot counts the kernel's instructions per function
        in the timed windows (a trial of the profile's size).  The profile's
        `attribution` may ask for one of the two only."""
        with self._host_clock(arm, plan):
            return self._attribute(arm, plan)

    def _attribute(self, arm: Arm, plan: Plan) -> dict[str, dict]:
        wl = plan.workload
        wanted = set(plan.profile.attribution) or {"guest_trace", "functions", "state_functions"}
        found = {}
        count = tuple(plan.profile.trace_count) or wl.mm_paths
        time_ = tuple(plan.profile.trace_time) or wl.mm_paths[:1]
        if "guest_trace" in wanted and not (count or time_):
            self.say(f"{arm.name}: no guest trace: {wl.name} names no mm paths to trace "
                     "(give the profile trace_count or trace_time)")
        elif "guest_trace" in wanted:
            got = sample(self.guest(arm, plan), wl, arm.params, GUEST_TRACE_SAMPLES, warmups=0,
                         settings=arm.settings, instrument=Instrumentation(count, time_))
            found["guest_trace"] = guest_trace_record(got)
        if wanted & {"functions", "state_functions"}:   # and from each saved boot, if asked
            found |= snapshot.by_function(arm, plan, wanted,
                                          lambda k: self._functions(arm, plan, k))
        return found

    def _functions(self, arm: Arm, plan: Plan, state: int) -> functions.FunctionInsns | None:
        """Kernel instructions per function in the timed windows, from saved
        boot `state`, where the guest runs under TCG and mmlab's plugin
        builds; otherwise the reason is said and there are none."""
        if not plan.workload.windows:
            return None
        try:
            return count_functions(self.guest(arm, plan, state), plan.workload, arm.params,
                                   plan.profile.samples_per_trial, plan.profile.warmups,
                                   arm.settings, qemu_plugin.ensure())
        except MmlabError as exc:
            self.say(f"{arm.name}: no per-function instruction counts: {exc}")
            return None
