"""Guest kernels: fetching, the initramfs format, result framing, and real
boots under QEMU (TCG here) that succeed, panic, hang or name an unknown
kernel.  Boots are kept short: small memory, one short trial."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
import os
import shutil
import subprocess

import pytest

from mmlab import workloads
from mmlab.attribution.guest import Instrumentation
from mmlab.errors import MmlabError
from mmlab.experiment.plan import parse
from mmlab.judge import audit
from mmlab.kernels import images, specs
from mmlab.machine.knobs import HostSettings
from mmlab.targets import boot, initramfs, qemu, snapshot
from mmlab.workloads.mmwork import TrialFailed

from .conftest import MMLAB, mmlab, run_profile

pytestmark = pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                                reason="QEMU is not installed (make setup installs it)")
TINY = {"mapping-kb": 1024, "rounds": 2, "min-ms": 0}


def test_a_debian_kernel_is_cached_with_its_config(k612):
    assert k612.image.stat().st_size > 1 << 20
    assert k612.version.startswith("6.12.")
    assert k612.config_sha256 == hashlib.sha256(k612.config.read_bytes()).hexdigest()
    feats = k612.features()
    assert feats["KSM"] == "y" and feats["THP"] == "y" and feats["KPROBES"] == "y"
    assert "debian:6.12" in [k.name for k in images.cached()]


def test_unknown_versions_and_kernels_are_clear_errors():
    with pytest.raises(MmlabError, match=r"debian:5\.99: the Debian catalog has no 5\.99 cloud"):
        specs.resolve("5.99")
    with pytest.raises(MmlabError, match=r"debian:six: expected debian:MAJOR\.MINOR"):
        specs.resolve("six")
    with pytest.raises(MmlabError, match=r"unknown kernel 'local:nope'.*mmlab kernels add"):
        images.get("local:nope")


def test_initramfs_is_a_newc_archive_cpio_can_read(tmp_path):
    base = initramfs.base_archive(tmp_path)
    listing = subprocess.run(["cpio", "-it", "--quiet"], input=gzip.decompress(base.read_bytes()),
                             capture_output=True).stdout.decode().split()
    assert {"init", "bin/busybox", "bin/mmwork"} <= set(listing)
    assert initramfs.base_archive(tmp_path) == base          # cached by content
    trial = initramfs.trial_initrd(base, "echo hi\n", tmp_path / "t")
    assert trial.stat().st_size % 4 != 1 and trial.read_bytes().startswith(base.read_bytes())


def test_frames_are_checked():
    data = b"hello"
    good = (f"MMLAB-FRAME stdout {hashlib.sha256(data).hexdigest()} 5\n"
            f"{base64.b64encode(data).decode()}\nMMLAB-END stdout\n")
    assert boot._frames(good) == {"stdout": b"hello"}
    with pytest.raises(TrialFailed, match="corrupted"):
        boot._frames(good.replace(base64.b64encode(data).decode(),
                                  base64.b64encode(b"hellO").decode()))


def test_a_trial_runs_in_the_guest_with_its_settings(k612):
    """The arm's THP mode is in force in the guest; what the guest's kernel
    booted with is kept beside it: a 512 MiB guest (MemTotal below 512 MiB)
    boots with every THP flag cleared, and the audit says why in words."""
    guest = boot.Guest(k612, vcpus=1, memory_mb=512, timeout_s=120)
    samples = qemu.sample(guest, workloads.get("pageout-refault"), {**TINY, "thp": "hugepage"},
                          samples=2, warmups=0, settings=HostSettings(thp="always"))
    assert len(samples) == 2
    for s in samples:
        assert s.state["kernel"] == k612.version            # measured inside the guest
        assert s.state["thp_enabled"] == "always"           # the arm's setting, in the guest
        assert s.state["accelerator"] in ("kvm", "tcg") and s.state["target"] == "qemu"
        assert s.metrics["cycle_ns_per_page"] > 0
        assert s.state["mem_total_kb"] < 512 * 1024
        assert (s.state["boot_thp_enabled"], s.state["boot_thp_defrag"],
                s.state["boot_thp_use_zero_page"]) == ("never", "never", 0.0)
        assert s.state["min_free_kbytes"] > 0
    (note,) = audit.guest_thp_notes({"a": samples})
    assert note.startswith("a: guest THP: never at boot (512 MiB guest, MemTotal ")
    assert "the kernel turns THP off below 512 MiB of memory); during the trial: always" in note


def test_a_broken_command_line_is_a_failed_trial_with_the_console(k612):
    guest = boot.Guest(k612, memory_mb=256, timeout_s=60, extra_cmdline="rdinit=/no/such/init",
                       start="boot")
    with pytest.raises(boot.BootFailed, match=r"kernel panic in the guest.*console: "):
        qemu.sample(guest, workloads.get("pageout-refault"), TINY, 1, 0, HostSettings())


def test_a_hung_guest_is_killed_and_reported(k612):
    guest = boot.Guest(k612, memory_mb=256, timeout_s=6)
    with pytest.raises(TrialFailed, match=r"guest hung: no result from debian:6\.12 after 6 s"):
        qemu.sample(guest, workloads.get("mremap-churn"), {"seconds": 120}, 1, 0, HostSettings())


KERNEL_AXIS = """
name = "kernel-axis"
workload = "pageout-refault"
repetitions = 3
metrics = ["advise_ns_per_page"]
baseline = { cpus = 1 }
memory_mb = 256
timeout_s = 120
[params]
mapping-kb = 1024
rounds = 2
min-ms = 0
[matrix]
kernel = ["debian:6.12"]
cpus = [1, 2]
"""


def test_kernel_axis_experiment_end_to_end(k612, tmp_path):
    """A kernel no cache holds and nothing can fetch is refused before a
    store is made; the guest arms run, name their accelerator and compare."""
    refused, results = run_profile(tmp_path, KERNEL_AXIS.replace(
        '["debian:6.12"]', '["debian:6.12", "local:nope"]'))
    assert refused.returncode == 2 and not results.exists(), refused.stderr
    assert refused.stderr.splitlines()[-1].startswith("mmlab: unknown kernel 'local:nope'")
    proc, results = run_profile(tmp_path, KERNEL_AXIS)
    assert proc.returncode == 0, proc.stderr
    assert "6 run now" in proc.stdout
    assert "TCG" in proc.stdout or "KVM" in proc.stdout          # the accelerator is named
    rows = json.loads(mmlab("compare", "1", "--results", str(results), "--json").stdout)
    ok = [r for r in rows if r["arm"] == "kernel=debian:6.12,cpus=2"]
    assert ok and ok[0]["baseline"] == "kernel=debian:6.12,cpus=1" and ok[0]["ratio"] > 0


def test_instrumented_guest_run_counts_and_times_kernel_functions(k612, tmp_path):
    """The no-swap MADV_PAGEOUT chain of seed 001: every folio asks for swap.
    `mmlab run` times one trial, then traces one boot of its own, stored as
    the experiment's attribution (the timings are never instrumented)."""
    results = str(tmp_path / "r")
    proc = mmlab("run", "pageout-refault", "--kernel", "debian:6.12", "--memory-mb", "256",
                 "--samples", "1", "--mapping-kb", "1024", "--rounds", "2", "--min-ms", "0",
                 "--trace-count", "folio_alloc_swap", "--trace-time", "reclaim_pages",
                 "--results", results)
    assert proc.returncode == 0, proc.stderr
    assert "folio_alloc_swap" in proc.stdout and "reclaim_pages" in proc.stdout
    (s,) = [json.loads(line) for line in
            mmlab("run", "pageout-refault", "--kernel", "debian:6.12", "--memory-mb", "256",
                  "--samples", "1", "--mapping-kb", "1024", "--rounds", "2", "--min-ms", "0",
                  "--json", "--results", results).stdout.splitlines()]
    assert s["state"]["instrumented"] == 0
    found = json.loads(mmlab("explain", "1", "--json", "--results", results).stdout)
    (trace,) = found["guest_traces"]
    value = {(f["figure"], f["function"]): f["value"] for f in trace["figures"]}
    rounds = 2 * qemu.GUEST_TRACE_SAMPLES            # the traced boot has no warm-up
    assert value[("calls", "folio_alloc_swap")] >= 256 * rounds
    assert value[("timed_calls", "reclaim_pages")] >= rounds
    assert value[("max_us", "reclaim_pages")] > 0


def test_a_profile_may_ask_for_the_functions_alone(k612):
    """attribution = ["functions"]: the instruction counts by function, and
    no traced boot (the release tracker's explanations need no more)."""
    plan = parse("""
name = "functions-only"
workload = "pageout-refault"
memory_mb = 256
repetitions = 1
metrics = ["advise_ns_per_page"]
baseline = { kernel = "debian:6.12" }
attribution = ["functions"]
[params]
mapping-kb = 1024
rounds = 2
min-ms = 0
[matrix]
kernel = ["debian:6.12"]
""")
    found = qemu.QemuTarget("debian:6.12", say=lambda _: None).attribute(plan.arms[0], plan)
    assert set(found) == {"functions"}
    assert found["functions"]["windows"]["advise"]


@pytest.mark.slow      # ~20 s of panicking boots; the direct test below keeps the console's word
def test_a_broken_cmdline_in_a_profile_is_a_failed_trial(k612, tmp_path):
    proc, _ = run_profile(tmp_path, """
name = "broken"
workload = "pageout-refault"
kernel = "debian:6.12"
cmdline = "rdinit=/no/such/init"
memory_mb = 256
repetitions = 2
metrics = ["advise_ns_per_page"]
baseline = "A"
[params]
mapping-kb = 1024
[[arms]]
name = "A"
""", timeout=600)
    assert proc.returncode == 1, proc.stderr
    assert "2 failed" in proc.stdout and "kernel panic in the guest" in proc.stdout


def test_an_oom_kill_in_the_guest_is_a_failed_trial(k612):
    """One worker whose mapping alone is more than the guest has free
    (210,000 KiB of the 217,180 KiB MemTotal of a 256 MiB guest, no swap;
    mmwork refuses a size not below MemTotal): the OOM killer must come,
    whatever the guest's scheduling.  Four workers of 60,000 KiB met it only
    when their mappings overlapped in time, and beside a host load of 6 to
    10 they once did not."""
    guest = boot.Guest(k612, vcpus=1, memory_mb=256, timeout_s=120)
    params = {"backing": "anon", "workers": 1, "size-kb": 210000, "rounds": 1, "min-ms": 0}
    with pytest.raises(TrialFailed, match=r"killed by the OOM killer in the guest: Out of memory"):
        qemu.sample(guest, workloads.get("unmap-young"), params, 1, 0, HostSettings())


def test_missing_trace_functions_are_skipped_not_fatal(k612):
    guest = boot.Guest(k612, memory_mb=256, timeout_s=120)
    instrument = Instrumentation(count=("no_such_function_mmlab", "folio_alloc_swap"))
    (s,) = qemu.sample(guest, workloads.get("pageout-refault"), TINY, 1, 0, HostSettings(),
                       instrument=instrument)
    assert s.counts["trace_skipped.no_such_function_mmlab"] == 1
    assert s.counts["trace_calls.folio_alloc_swap"] >= 256


def test_guest_arms_get_attribution_trials_and_explain_shows_them(k612, tmp_path):
    run, results = run_profile(tmp_path, """
name = "guest-attribution"
workload = "pageout-refault"
kernel = "debian:6.12"
memory_mb = 256
repetitions = 3
metrics = ["advise_ns_per_page"]
baseline = "A"
attribute = true
[params]
mapping-kb = 1024
rounds = 2
min-ms = 0
[[arms]]
name = "A"
""")
    assert run.returncode == 0, run.stderr
    out = json.loads(mmlab("explain", "1", "--results", str(results), "--json").stdout)
    (g,) = out["guest_traces"]
    rows = {(f["figure"], f["function"]): f["value"] for f in g["figures"]}
    first = workloads.get("pageout-refault").mm_paths[0]       # counted and timed by default
    assert rows[("calls", first)] > 0 and rows[("timed_calls", first)] > 0
    assert g["accelerator"] in ("tcg", "kvm")
    if g["accelerator"] == "tcg":       # the plugin counted the kernel by function too
        windows = {w["window"]: w for w in out["functions"]}
        assert windows["advise"]["kernel"] > 0 and windows["advise"]["rows"]
        assert windows["advise"]["baseline"] is None          # one arm: its own largest
        report = mmlab("report", "1", "--results", str(results)).stdout
        assert "A: kernel instructions per page in advise" in report


# ---------------------------------------------------------------- the catalog, swap and NUMA

def test_a_split_packaged_kernel_from_another_suite_is_cached_whole(k73):
    """7.3: vmlinuz from linux-binary, config from linux-base, zram and
    virtio_blk from linux-modules; the exact package version and suite kept."""
    assert k73.version.startswith("7.3.") and k73.packaging == "split"
    assert k73.suite not in ("bookworm", "") and k73.package_version.startswith("7.3.")
    assert k73.config_sha256 == hashlib.sha256(k73.config.read_bytes()).hexdigest()
    assert k73.features()["ZRAM"] == "m" and "zram" in k73.modules and "virtio_blk" in k73.modules
    assert all((k73.image.parent / "modules" / f"{m}.ko").read_bytes()[:4] == b"\x7fELF"
               for m in k73.modules)                     # decompressed for busybox insmod
    assert k73.identity().startswith(k73.version + " (" + k73.package_version)


def test_cache_entries_of_other_versions_are_skipped(tmp_path, k612):
    good = json.loads((k612.image.parent / "kernel.json").read_text())
    old = {k: v for k, v in good.items() if k in ("name", "version", "source", "config_sha256",
                                                  "dir", "details")}
    for name, record in (("old", {**old, "name": "debian:old"}),
                         ("new", {**good, "name": "debian:new", "from_the_future": 1})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "kernel.json").write_text(json.dumps(record))
    (got,) = images.cached(tmp_path)
    assert got.name == "debian:old" and got.format == 1 and got.modules == []


def _pageout(k, swap, **guest):
    g = boot.Guest(k, memory_mb=256, timeout_s=180, **guest)
    (s,) = qemu.sample(g, workloads.get("pageout-refault"), {"mapping-kb": 4096, "rounds": 2,
                                                           "min-ms": 0}, 1, 0,
                    HostSettings(swap=swap))
    return s


@pytest.mark.parametrize("swap", ["zram:64M", "file:64M"])
def test_a_guest_swaps_to_zram_or_a_virtio_disk(k73, swap):
    """The audit's swap state comes from inside the guest, as on the host:
    swap configured, pages really written out, and a slower refault."""
    s = _pageout(k73, swap)
    assert s.state["swap_total_kb"] == pytest.approx(64 * 1024, abs=8)
    assert s.state["after_pageout_swap_kb"] > 0 and s.vmstat_delta["pswpout"] >= 1024
    none = _pageout(k73, "none")
    assert none.state["swap_total_kb"] == 0 and none.vmstat_delta["pswpout"] == 0
    assert s.metrics["post_touch_ns_per_page"] > 2 * none.metrics["post_touch_ns_per_page"]


def test_numa_guest_migrates_every_ksm_page_with_move_pages(k73):
    g = boot.Guest(k73, memory_mb=512, timeout_s=300, numa_nodes=2)
    (s,) = qemu.sample(g, workloads.get("ksm-rmap"), {"vmas": 200, "trigger": "move",
                                                   "no-writer": True}, 1, 0, HostSettings())
    assert s.state["numa_nodes"] == 2 and s.state["guest_numa_nodes"] == 2
    assert s.counts["ksm_pages"] > 0 and s.counts["ksm_pages_migrated"] == s.counts["ksm_pages"]
    assert not s.errors and s.metrics["ms_per_migrated_page"] > 0


def test_numa_qemu_arguments_split_memory_and_vcpus():
    args = boot.numa_args(2, 3, 1000)
    assert args == ["-object", "memory-backend-ram,id=mem0,size=500M",
                    "-numa", "node,nodeid=0,cpus=0,cpus=2,memdev=mem0",
                    "-object", "memory-backend-ram,id=mem1,size=500M",
                    "-numa", "node,nodeid=1,cpus=1,memdev=mem1"]
    assert boot.numa_args(1, 4, 1000) == []
    with pytest.raises(MmlabError, match="less than 64 MiB"):
        boot.numa_args(4, 1, 128)


def test_a_profile_runs_swap_and_numa_arms_in_guests(k73, tmp_path):
    proc, results = run_profile(tmp_path, """
name = "guest-swap-numa"
workload = "mremap-churn"
kernel = "debian:7.3"
memory_mb = 256
timeout_s = 120
repetitions = 3
metrics = ["ops_per_s_cpu"]
baseline = "plain"
[params]
seconds = 0.2
numa-move = true
[[arms]]
name = "plain"
[[arms]]
name = "zram-numa"
set = { swap = "zram:32M", numa_nodes = 2 }
""")
    assert proc.returncode == 0, proc.stderr
    assert "6 run now" in proc.stdout and "failed" not in proc.stdout.replace("0 failed", "")
    from mmlab.store import Store
    by_arm = Store(results).samples_by_arm(1)
    assert len(by_arm["zram-numa"]) == len(by_arm["plain"]) == 3
    for s in by_arm["zram-numa"]:            # measured inside the guest, as on the host
        assert s.state["swap_total_kb"] > 0 and s.state["guest_numa_nodes"] == 2
        assert s.state["numa_nodes"] == 2
    for s in by_arm["plain"]:
        assert s.state["swap_total_kb"] == 0 and s.state["guest_numa_nodes"] == 1


@pytest.mark.parametrize("setting, wanted", [
    ("numa_nodes = 2", r"numa_nodes: 2: NUMA nodes are made for guests"),
    ('guest_start = "boot"', r"guest_start: 'boot': only a guest starts"),
])
def test_host_arms_refuse_guest_settings(setting, wanted):
    from mmlab.experiment.plan import parse
    with pytest.raises(MmlabError, match=wanted):
        parse(f"""
name = "x"
workload = "pageout-refault"
repetitions = 3
metrics = ["advise_ns_per_page"]
baseline = "a"
[[arms]]
name = "a"
set = {{ {setting} }}
""")


def test_catalog_errors_are_one_line(tmp_path):
    """A bad name, an unknown release, and a registry that cannot be reached."""
    import os
    import socket
    with socket.socket() as sock:                 # a local port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "MMLAB_KERNEL_CACHE": str(tmp_path / "kernels"),
           "MMLAB_APT_MIRROR": f"http://127.0.0.1:{port}/debian"}
    unreachable = subprocess.run([*MMLAB, "kernels", "add", "debian:7.3"], capture_output=True,
                                 text=True, env=env, timeout=120)
    assert unreachable.returncode == 2
    assert unreachable.stderr.count("\n") == 1
    assert f"the Debian registry at http://127.0.0.1:{port}/debian cannot be reached" in \
        unreachable.stderr
    for spec, why in (("debian:7.3.x", "expected debian:MAJOR.MINOR"),
                      ("debian:9.1", r"the Debian catalog has no 9.1 cloud kernel"),
                      ("debian:6.12.999", "no 6.12.999 cloud kernel")):
        proc = mmlab("kernels", "add", spec)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert re.search(why, proc.stderr), proc.stderr


def test_kernels_available_lists_both_packagings(k73):
    proc = mmlab("kernels", "available")
    assert proc.returncode == 0, proc.stderr
    assert "debian:7.3-generic" in proc.stdout and "split" in proc.stdout
    rows = {(e["series"], e["flavour"]): e
            for e in json.loads(mmlab("kernels", "available", "--json").stdout)}
    assert rows[("7.3", "cloud")]["packaging"] == "split"
    assert rows[("6.12", "cloud")]["packaging"] in ("unsigned", "signed")
    assert ("7.3", "generic") in rows
    one = mmlab("kernels", "available", "7.3", "--json")
    assert {e["series"] for e in json.loads(one.stdout)} == {"7.3"}


def test_a_restored_guest_measures_with_the_state_a_booted_one_has(k612):
    """The first trial saves a booted guest, later ones restore it (no new
    snapshot); booted and restored samples carry the same state, labelled
    with how their guest started."""
    wl, settings = workloads.get("pageout-refault"), HostSettings(thp="always")
    booted = qemu.sample(boot.Guest(k612, memory_mb=288, timeout_s=120, start="boot"), wl,
                         TINY, 1, 0, settings)[0]
    guest = boot.Guest(k612, memory_mb=288, timeout_s=120)
    first = qemu.sample(guest, wl, TINY, 1, 0, settings)[0]
    root = snapshot.snapshot_root(boot.initramfs_cache())
    made = {d.name for d in root.iterdir()}
    second = qemu.sample(guest, wl, TINY, 1, 0, settings)[0]
    assert {d.name for d in root.iterdir()} == made       # restored, not saved again
    assert booted.state["guest_start"] == "booted"
    assert first.state["guest_start"] == second.state["guest_start"] == "restored"
    assert set(booted.state) == set(second.state)
    for s in (booted, first, second):
        assert s.state["thp_enabled"] == "always" and s.state["kernel"] == k612.version
        assert s.metrics["cycle_ns_per_page"] > 0
    assert second.state["boot_s"] < booted.state["boot_s"]


def test_a_restored_guest_gets_its_script_byte_for_byte(k612):
    """The trial goes down the serial port after the restore: quotes, dollars,
    backslashes, UTF-8 and a line longer than the tty's buffer arrive intact."""
    guest = boot.Guest(k612, memory_mb=288, timeout_s=60)
    accel, _ = boot.accelerator(k612, boot.initramfs_cache())
    odd = "it's \"$HOME\" \\n \u00e9\u00df\u4e2d " + "x" * 6000
    with snapshot.held(guest, accel, boot.initramfs_cache(), None, ()) as snap:
        got = snapshot.restore(guest, snap, f"cat <<'EOF'\n{odd}\nEOF\n"
                               "cat /proc/sys/kernel/softlockup_panic\n", accel, None)
    assert got.start == "restored" and got.frames["stdout"].decode() == odd + "\n1\n"


def test_without_a_snapshot_trials_boot_and_say_why(k612, tmp_path, monkeypatch):
    """No zstd for QEMU's migration: the snapshot cannot be saved, so the
    trial boots, its samples say so, and the reason is said."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / boot.QEMU).symlink_to(shutil.which(boot.QEMU))
    monkeypatch.setenv("PATH", str(bindir))
    said = []
    guest = boot.Guest(k612, memory_mb=304, timeout_s=120)
    (s,) = qemu.sample(guest, workloads.get("pageout-refault"), TINY, 1, 0, HostSettings(),
                       say=said.append)
    assert s.state["guest_start"] == "booted"
    assert said and "booting every trial" in said[0] and "could not be saved" in said[0]



def test_a_restored_guest_that_died_before_its_trial_is_restored_again(monkeypatch):
    """A restore that panics before the trial began is tried again, and
    the sample says how many starts it took; a failed trial is not."""
    from contextlib import nullcontext

    from mmlab.targets import boot, snapshot
    from mmlab.workloads.mmwork import TrialFailed
    calls = []

    def restore(guest, snap, script, accel, swap, plugin, extra):
        calls.append(1)
        if len(calls) == 1:
            raise boot.BootFailed("kernel panic in the guest: Fatal exception in interrupt")
        return "restored"
    monkeypatch.setattr(snapshot, "held", lambda *a: nullcontext("snap"))
    monkeypatch.setattr(snapshot, "restore", restore)
    guest = boot.Guest(None)
    assert qemu.start(guest, "", "tcg", None, None, (), None) == ("restored", 1)

    def failed(*a):
        calls.append(1)
        raise TrialFailed("kernel panic in the guest, in the trial")
    monkeypatch.setattr(snapshot, "restore", failed)
    with pytest.raises(TrialFailed):
        qemu.start(guest, "", "tcg", None, None, (), None)
    assert len(calls) == 3


def test_a_boot_that_fails_the_same_way_twice_is_not_started_a_third_time():
    """A flake dies differently each time; a command line naming no init
    panics alike on every boot, and a third boot would only wait again."""
    from mmlab.targets import boot
    calls = []

    def start(reasons):
        def one():
            calls.append(1)
            raise boot.BootFailed(f"panic; console: [ {len(calls)}.0] ...", reasons[len(calls) - 1])
        return one
    with pytest.raises(boot.BootFailed):
        boot.retrying(start(["No working init found"] * 3))
    assert len(calls) == 2
    calls.clear()
    with pytest.raises(boot.BootFailed):
        boot.retrying(start(["Fatal exception in interrupt", "double fault", "Oops: 0000"]))
    assert len(calls) == 3
    assert boot.BootFailed("varies [ 1.2]").reason != boot.BootFailed("varies [ 3.4]").reason


def test_a_script_whose_boot_died_early_is_run_again(monkeypatch, tmp_path):
    """kallsyms for counting by function and a peer tool's run come from
    run_script: a boot that dies before the script (an int3 oops in code
    patched at boot on another vCPU) is started again, as a trial's is."""
    from mmlab.targets import boot
    calls = []

    def once(guest, script, accel, cache, swap=None, archives=()):
        calls.append(1)
        if len(calls) == 1:
            raise boot.BootFailed("kernel panic; console: Oops: int3", "Oops: int3")
        return boot.BootResult({"rc": b"0", "stdout": b"symbols", "stderr": b""}, "", 1.0)
    monkeypatch.setattr(boot, "boot_once", once)
    monkeypatch.setattr(boot, "accelerator", lambda kernel, cache: ("tcg", ""))
    assert boot.run_script(boot.Guest(None), "true", cache=tmp_path) == "symbols"
    assert len(calls) == 2


def test_a_snapshot_whose_boot_died_early_is_made_again(monkeypatch):
    """An emulated boot now and then panics before /init: the save is tried
    again, as a boot is; any other failure is not."""
    from mmlab.targets import boot, snapshot
    calls = []

    def save(guest, accel, snap, swap):
        calls.append(1)
        if len(calls) == 1:
            raise snapshot.SnapshotUnavailable("x") from boot.BootFailed("panic")
    monkeypatch.setattr(snapshot, "_save", save)
    snapshot._save_retrying(None, "tcg", None, None)
    assert len(calls) == 2

    def broken(guest, accel, snap, swap):
        calls.append(1)
        raise snapshot.SnapshotUnavailable("migration failed")
    monkeypatch.setattr(snapshot, "_save", broken)
    with pytest.raises(snapshot.SnapshotUnavailable, match="migration failed"):
        snapshot._save_retrying(None, "tcg", None, None)
    assert len(calls) == 3


def test_a_guest_that_could_not_be_saved_is_not_booted_to_be_saved_again(k612, tmp_path,
                                                                         monkeypatch):
    """Every trial of a command line that panics would boot twice to be
    saved before booting for itself: the second trial boots at once."""
    from mmlab.targets import snapshot
    calls = []

    def save(guest, accel, snap, swap):
        calls.append(1)
        raise snapshot.SnapshotUnavailable("debian:6.12 could not be saved: panic")
    monkeypatch.setattr(snapshot, "_save", save)
    monkeypatch.setattr(snapshot, "_UNSAVED", {})
    guest = boot.Guest(k612, memory_mb=256, extra_cmdline="rdinit=/no/such/init")
    for _ in range(2):
        with pytest.raises(snapshot.SnapshotUnavailable, match="could not be saved: panic"):
            with snapshot.held(guest, "tcg", tmp_path / "initramfs", None, ()):
                pass
    assert len(calls) == 1


def test_snapshots_are_kept_most_recently_used_first_within_their_bytes(tmp_path, monkeypatch):
    from mmlab.targets import snapcache
    for age, name in enumerate(("new", "mid", "old")):
        d = tmp_path / name
        d.mkdir()
        (d / "initrd").write_bytes(b"i" * 100)
        (d / "state.zst").write_bytes(b"s" * 900)
        os.utime(d / "state.zst", (1e9 - age, 1e9 - age))
    (tmp_path / "filling").mkdir()                # being saved: no state yet, left alone
    monkeypatch.setattr(snapcache, "KEEP_BYTES", 2500)
    snapcache.prune(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["filling", "mid", "new"]


def test_a_pvm_or_vmx_less_kvm_means_tcg_at_once_with_the_reason(tmp_path, monkeypatch):
    """No probe boot where the machine's /dev/kvm cannot serve a stock
    kernel: a PVM /dev/kvm (kvm_pvm loaded) or a CPU without vmx/svm says
    so, and the kernel goes to TCG at once; elsewhere one probe boot tells,
    and QEMU's first error line is kept as the reason."""
    from types import SimpleNamespace

    from mmlab.targets import boot
    booted = []

    def probe_boot(*a, **k):
        booted.append(1)
        raise boot.TrialFailed("qemu: failed to set MSR 0x10a to 0x1\nmore lines")
    monkeypatch.setattr(boot, "boot_once", probe_boot)
    kernel = SimpleNamespace(dir=str(tmp_path), name="debian:6.12")
    monkeypatch.setattr(boot, "DEV_KVM", tmp_path)                 # present
    (tmp_path / "pvm").mkdir()
    monkeypatch.setattr(boot, "PVM_MODULE", tmp_path / "pvm")
    accel, why = boot.accelerator(kernel, tmp_path)
    assert (accel, booted) == ("tcg", []) and "PVM" in why
    monkeypatch.setattr(boot, "PVM_MODULE", tmp_path / "absent")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor : 0\nflags : fpu sse2 hypervisor\n")
    monkeypatch.setattr(boot, "CPUINFO", cpuinfo)
    assert boot.accelerator(kernel, tmp_path)[1].startswith("the CPU has no vmx or svm")
    assert booted == []
    cpuinfo.write_text("processor : 0\nflags : fpu vmx sse2\n")
    accel, why = boot.accelerator(kernel, tmp_path)
    assert booted == [1] and why == "KVM boot failed: qemu: failed to set MSR 0x10a to 0x1"
    monkeypatch.setattr(boot, "DEV_KVM", tmp_path / "none")
    assert boot.accelerator(kernel, tmp_path) == ("tcg", "no /dev/kvm")


FAKE_QEMU = r"""
import ctypes, sys, threading, time
libc = ctypes.CDLL(None)
def named(name):
    libc.prctl(15, name.encode(), 0, 0, 0)       # PR_SET_NAME: how QEMU names vCPU threads
    time.sleep(30)
for n in range(int(sys.argv[1])):
    threading.Thread(target=named, args=(f"CPU {n}/KVM",), daemon=True).start()
threading.Thread(target=named, args=("worker",), daemon=True).start()
time.sleep(30)
"""


def test_a_kvm_guest_is_pinned_preallocated_and_says_so(tmp_path, monkeypatch):
    """Under KVM (a fake QEMU here: no machine of this project has KVM),
    each vCPU thread gets a host CPU of its own and the other threads stay
    off it; memory is preallocated (per node with NUMA); the environment
    says how the guest ran.  TCG gets none of it."""
    import os
    import subprocess
    import sys
    from types import SimpleNamespace

    from mmlab.targets import boot, kvm, qemu
    cpus = os.sched_getaffinity(0)
    mine, rest = kvm.placement(1, cpus)
    assert len(set(mine.values())) == 1 and (rest == cpus - set(mine.values()) or len(cpus) == 1)
    fake = tmp_path / "qemu.py"
    fake.write_text(FAKE_QEMU)
    proc = subprocess.Popen([sys.executable, str(fake), "1"])
    try:
        kvm.pin(proc, 1).join(10)
        threads = kvm._threads(proc.pid)
        vcpu = next(t for t, name in threads.items() if name == "CPU 0/KVM")
        assert os.sched_getaffinity(vcpu) == {mine[0]}
        others = [t for t, name in threads.items() if name != "CPU 0/KVM"]
        assert all(os.sched_getaffinity(t) == rest for t in others)
    finally:
        proc.kill()
        proc.wait()
    kernel = SimpleNamespace(image=tmp_path / "bzImage", name="k", version="v", source="s",
                             package_version="p", suite="", flavour="", packaging="",
                             config_sha256="")
    guest = boot.Guest(kernel, vcpus=2, memory_mb=512)
    argv = boot.qemu_argv(guest, tmp_path / "initrd", "kvm", tmp_path / "c", [])
    assert {"-cpu", "host", "-mem-prealloc", "mmlab,debug-threads=on"} <= set(argv)
    numa = boot.Guest(kernel, vcpus=2, memory_mb=512, numa_nodes=2)
    assert all("prealloc=on" in a for a in boot.qemu_argv(numa, tmp_path / "i", "kvm",
                                                        tmp_path / "c", [])
               if a.startswith("memory-backend-ram"))
    tcg = boot.qemu_argv(guest, tmp_path / "initrd", "tcg", tmp_path / "c", [])
    assert "-mem-prealloc" not in tcg and "host" not in tcg
    env = qemu.guest_environment(guest, "kvm", "boots under KVM")
    assert env["vcpu_pinning"].startswith("one host CPU each")
    assert env["guest_memory_backing"].startswith("preallocated")
    assert qemu.guest_environment(guest, "tcg", "PVM")["vcpu_pinning"].startswith("none")
