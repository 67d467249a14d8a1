"""What this machine offers and lacks, each fact measured when asked.

Every later decision (host or guest, TCG or KVM, perf or tracefs, swap file
or zram) starts from these facts, so each one is read from the kernel or
found by trying, never assumed from the distribution or a config file alone.
"""

from __future__ import annotations

import fcntl
import os
import platform
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from mmlab import __version__
from mmlab.kernels import qemu_plugin
from mmlab.machine import cpufreq, knobs
from mmlab.machine.knobs import Journal, Tracefs, active_swaps
from mmlab.targets import boot
from mmlab.workloads import insns
from mmlab.workloads.build import REPO_ROOT

MM_EVENT_SYSTEMS = ("lock", "mmap_lock", "vmscan", "compaction", "migrate", "ksm",
                    "huge_memory", "thp")
KVM_GET_API_VERSION = 0xAE00
KVM_CREATE_VM = 0xAE01


@dataclass(frozen=True)
class Fact:
    what: str
    value: str
    ok: bool       # False: missing or limited, and `note` says what follows
    note: str = ""


def _read(path: str, default: str = "") -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return default


def _cmd(*argv: str, timeout: float = 20) -> subprocess.CompletedProcess | None:
    if not shutil.which(argv[0]):
        return None
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


def cpu_model() -> str:
    m = re.search(r"^model name\s*:\s*(.+)$", _read("/proc/cpuinfo"), re.M)
    return m.group(1) if m else platform.processor() or "unknown"


def _kernel() -> Fact:
    return Fact("kernel", f"{platform.release()} ({platform.machine()})", True)


def _cpus() -> Fact:
    return Fact("CPUs", f"{os.cpu_count()} x {cpu_model()}, governor "
                f"{cpufreq.Governor().read()}, turbo {cpufreq.Turbo().read()}", True)


def _memory() -> Fact:
    m = re.search(r"MemTotal:\s+(\d+)", _read("/proc/meminfo"))
    gib = int(m.group(1)) / 2**20 if m else 0
    return Fact("memory", f"{gib:.1f} GiB", gib > 0)


def _thp() -> Fact:
    enabled = _read("/sys/kernel/mm/transparent_hugepage/enabled")
    if not enabled:
        return Fact("THP", "absent", False, "THP arms cannot run on this kernel")
    defrag = _read("/sys/kernel/mm/transparent_hugepage/defrag")
    sizes = sorted(p.name.removeprefix("hugepages-")
                   for p in Path("/sys/kernel/mm/transparent_hugepage").glob("hugepages-*"))
    return Fact("THP", f"enabled: {enabled}; defrag: {defrag}; "
                f"sizes: {', '.join(sizes) or '2048kB'}", True)


def _mglru() -> Fact:
    val = _read("/sys/kernel/mm/lru_gen/enabled")
    if not val:
        return Fact("LRU", "classic active/inactive lists (no MGLRU)", True)
    on = int(val, 0) != 0
    return Fact("LRU", f"MGLRU {'on' if on else 'off'} ({val})", True,
                "MGLRU changes folio_mark_accessed() and reclaim" if on else "")


def _ksm() -> Fact:
    if not Path("/sys/kernel/mm/ksm/run").exists():
        return Fact("KSM", "absent", False, "ksm-rmap cannot run on the host")
    run = _read("/sys/kernel/mm/ksm/run")
    sharing = _read("/sys/kernel/mm/ksm/pages_sharing")
    writable = os.access("/sys/kernel/mm/ksm/run", os.W_OK)
    return Fact("KSM", f"run={run}, pages_sharing={sharing}, max_page_sharing="
                f"{_read('/sys/kernel/mm/ksm/max_page_sharing')}", writable,
                "" if writable else "not writable: ksm-rmap needs root")


def _swap() -> Fact:
    swaps = active_swaps()
    return Fact("swap", ", ".join(f"{p} (prio {pr})" for p, pr in swaps) or "none active", True)


def _zram() -> Fact:
    devs = sorted(Path("/sys/block").glob("zram*"))
    if not devs:
        hot = Path("/sys/class/zram-control").exists()
        return Fact("zram", "no devices" + (" (hot_add available)" if hot else ""), hot,
                    "" if hot else "swap = zram arms unavailable (no zram module)")
    free = [d.name for d in devs if _read(str(d / "disksize")) == "0"]
    algos = _read(str(devs[0] / "comp_algorithm"))
    return Fact("zram", f"{len(devs)} device(s), free: {', '.join(free) or 'none'}; "
                f"algorithms: {algos}", bool(free))


def _numa() -> Fact:
    online = _read("/sys/devices/system/node/online", "0")
    nodes = sum(int(b) - int(a) + 1 if b else 1
                for a, b in re.findall(r"(\d+)(?:-(\d+))?", online))
    return Fact("NUMA nodes", f"{nodes} ({online})", True,
                "one node: --numa-move migrates within node 0 only" if nodes == 1 else "")


KHUGEPAGED = Path("/sys/kernel/mm/transparent_hugepage/khugepaged")


def damon() -> list[str]:
    """Every DAMON worker running now, in words: sysfs-started kdamonds with
    their operations and scheme actions, and the DAMON modules (reclaim,
    LRU sort, stat) that are enabled.  Each one pages out, sorts LRUs or
    reads access bits on its own, under whatever mmlab measures."""
    running = []
    for kd in sorted(Path(knobs.DAMON_KDAMONDS).glob("[0-9]*")):
        if _read(str(kd / "state")) != "on":
            continue
        for ctx in sorted(kd.glob("contexts/[0-9]*")):
            actions = [_read(str(s / "action")) for s in sorted(ctx.glob("schemes/[0-9]*"))]
            running.append(f"kdamond {kd.name} ({_read(str(ctx / 'operations'))}: "
                           f"{', '.join(actions) or 'monitoring only'})")
    for module in sorted(Path("/").glob(knobs.DAMON_MODULES.lstrip("/"))):
        if _read(str(module)) == "Y":
            running.append(f"{module.parts[3]} enabled")
    return running


def mm_actors() -> dict[str, str]:
    """The kernel threads that change mm state on their own, and how they are
    set: DAMON, khugepaged, ksmd and proactive compaction.  Stored with
    every trial, because two trials under different actors did not run in
    the same page state."""
    khuge = " ".join(f"{n}={_read(str(KHUGEPAGED / n), '-')}"
                     for n in ("defrag", "pages_to_scan", "scan_sleep_millisecs", "max_ptes_none"))
    return {
        "damon": "; ".join(damon()) or "off",
        "khugepaged": khuge if KHUGEPAGED.is_dir() else "absent",
        "ksmd": f"run={_read('/sys/kernel/mm/ksm/run', 'absent')}",
        "compaction_proactiveness": _read("/proc/sys/vm/compaction_proactiveness", "absent"),
    }


def _mm_actors_fact() -> Fact:
    actors = mm_actors()
    busy = actors["damon"] != "off"
    return Fact("mm actors", "; ".join(f"{k}: {v}" for k, v in actors.items()), not busy,
                "DAMON changes reclaim and LRU state on its own while workloads run; the "
                "same-state audit compares it between arms" if busy else "")


def _tracefs_fact() -> Fact:
    """Looked at mounted: as root mmlab mounts tracefs for a look (and for
    attribution) and unmounts it again, so 'not mounted' is no limit."""
    journal = Journal()
    with journal.session():
        was_mounted = Tracefs.find() is not None
        tf = Tracefs().mount(journal)
        return _tracefs_features(tf, was_mounted)


def _tracefs_features(tf: Path | None, was_mounted: bool) -> Fact:
    if not tf:
        return Fact("tracefs", "not mounted", False,
                    "no tracepoint aggregation on the host (mmlab mounts it only as root)")
    systems = [s for s in MM_EVENT_SYSTEMS if (tf / "events" / s).is_dir()]
    missing = [s for s in MM_EVENT_SYSTEMS if s not in systems]
    contention = (tf / "events/lock/contention_begin").is_dir()
    tracers = _read(str(tf / "available_tracers"))
    kprobes = (tf / "kprobe_events").exists()
    value = (f"{tf}; events: {', '.join(systems)}; lock:contention_begin "
             f"{'yes' if contention else 'no'}; tracers: {tracers}; kprobe_events "
             f"{'yes' if kprobes else 'no'}")
    note = []
    if missing:
        note.append(f"no {', '.join(missing)} events")
    if not kprobes:
        note.append("no kprobes on the host: function counts need a guest kernel")
    if "function_graph" not in tracers:
        note.append("no function_graph tracer")
    if not was_mounted:
        note.append("not mounted: mmlab mounts it when it traces and unmounts it afterwards")
    return Fact("tracefs", value, contention, "; ".join(note))


def _perf() -> list[Fact]:
    ver = _cmd("perf", "--version")
    if not ver or ver.returncode:
        return [Fact("perf", "not installed", False, "no stack sampling")]
    with tempfile.TemporaryDirectory() as tmp:
        rec = _cmd("perf", "record", "-q", "-e", "cpu-clock", "-g", "-o", f"{tmp}/p.data",
                   "--", "true")
    sampling = bool(rec and rec.returncode == 0)
    stat = _cmd("perf", "stat", "-x,", "-e", "instructions", "true")
    hw = bool(stat and stat.returncode == 0 and "<not supported>" not in stat.stderr
              and "not counted" not in stat.stderr)
    return [
        Fact("perf sampling", f"{ver.stdout.strip()}; cpu-clock with call graphs: "
             f"{'works' if sampling else 'fails'}", sampling,
             f"perf_event_paranoid={_read('/proc/sys/kernel/perf_event_paranoid')}"),
        Fact("hardware counters", "available" if hw else "not supported", hw,
             "" if hw else "software events only (cpu-clock, task-clock)"),
    ]


def _insns() -> list[Fact]:
    """Where kernel instructions per page can come from: the CPU's counters
    (tried with the very perf_event_open mmwork makes) and, for TCG
    guests, mmlab's QEMU plugin (built if its header is cached)."""
    host_ok, host = insns.perf_status()
    plugin_ok, plugin = qemu_plugin.status()
    return [
        Fact("instruction counts (host)", host, host_ok,
             "" if host_ok else "no PMU: host samples carry no instruction metrics"),
        Fact("instruction counts (TCG guests)", f"QEMU plugin {plugin}" if plugin_ok else plugin,
             plugin_ok, "" if plugin_ok else "guest samples carry no instruction metrics until "
             "the plugin is built"),
    ]


def _kvm() -> Fact:
    refused = boot.kvm_refused()
    if refused:
        return Fact("KVM", f"TCG ({refused})", False, "guests run under TCG (emulated timings)")
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
        try:
            api = fcntl.ioctl(fd, KVM_GET_API_VERSION)
            vm = fcntl.ioctl(fd, KVM_CREATE_VM, 0)
            os.close(vm)
        finally:
            os.close(fd)
    except OSError as exc:
        return Fact("KVM", f"/dev/kvm present but unusable: {exc.strerror}", False,
                    "guests run under TCG (emulated timings)")
    return Fact("KVM", f"/dev/kvm API {api}, VM creation works", True,
                "whether a stock kernel boots under it is tested per kernel image "
                "when one is booted; on this project's machines expect TCG")


def _tool(name: str, *version_args: str, need: str) -> Fact:
    proc = _cmd(name, *version_args)
    if not proc:
        return Fact(name, "not installed", False, need)
    text = (proc.stdout or proc.stderr).strip().splitlines()
    return Fact(name, text[0] if text else "installed", True)


def facts() -> list[Fact]:
    return [
        _kernel(), _cpus(), _memory(), _thp(), _mglru(), _ksm(), _swap(), _zram(), _numa(),
        _mm_actors_fact(),
        _tracefs_fact(), *_perf(), *_insns(),
        _tool("qemu-system-x86_64", "--version", need="no guest kernels"),
        _kvm(),
        _tool("busybox", "--help", need="no guest initramfs"),
        _tool("stress-ng", "--version", need="no peer stressor for `make bench`"),
        Fact("privileges", "root" if os.geteuid() == 0 else f"uid {os.geteuid()}",
             os.geteuid() == 0, "" if os.geteuid() == 0 else
             "KSM, THP, swap and compaction need root"),
    ]


@cache
def git_commit() -> str:
    """The checkout's commit, asked once per process (it cannot change mid-run)."""
    proc = _cmd("git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty")
    return proc.stdout.strip() if proc and proc.returncode == 0 else "unknown"


def environment() -> dict[str, object]:
    """The run environment stored with every trial."""
    def setting(path: str) -> str:
        text = _read(path, "absent")
        m = re.search(r"\[([^\]]+)\]", text)
        return m.group(1) if m else text
    return {
        "kernel": platform.release(),
        "kernel_version": platform.version(),
        "cmdline": _read("/proc/cmdline"),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "governor": cpufreq.Governor().read(),
        "turbo": cpufreq.Turbo().read(),
        "thp_enabled": setting("/sys/kernel/mm/transparent_hugepage/enabled"),
        "thp_defrag": setting("/sys/kernel/mm/transparent_hugepage/defrag"),
        "ksm_run": setting("/sys/kernel/mm/ksm/run"),
        "swap": [p for p, _ in active_swaps()],
        "mm_actors": mm_actors(),
        "mmlab_version": __version__,
        "git_commit": git_commit(),
    }


def machine() -> dict[str, object]:
    """What a fleet worker registers for its machine: the machine class a
    verdict belongs to (CPU model and count, memory, NUMA nodes, kernel, and
    whether guests get KVM or TCG)."""
    return {"cpu_model": cpu_model(), "cpus": os.cpu_count(), "memory": _memory().value,
            "numa_nodes": int(_numa().value.split()[0]), "kernel": _kernel().value,
            "accelerator": "kvm" if _kvm().ok else "tcg"}
