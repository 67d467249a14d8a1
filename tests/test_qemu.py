"""Guest kernels: fetching, the initramfs format, result framing, and real
boots under QEMU (TCG here) that succeed, panic, hang or name an unknown
kernel.  Boots are kept short: small memory, one short trial."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import shutil
import subprocess

import pytest

from mmlab import kernels, workloads
from mmlab.errors import MmlabError
from mmlab.knobs import HostSettings
from mmlab.targets import initramfs, qemu
from mmlab.targets.host import TrialFailed

from .conftest import mmlab, run_profile

pytestmark = pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                                reason="QEMU is not installed (make setup installs it)")
TINY = {"mapping-kb": 1024, "rounds": 2, "min-ms": 0}


@pytest.fixture(scope="session")
def k612() -> kernels.Kernel:
    try:
        return kernels.get("debian:6.12")
    except MmlabError:
        return kernels.add_debian("6.12")


def test_a_debian_kernel_is_cached_with_its_config(k612):
    assert k612.image.stat().st_size > 1 << 20
    assert k612.version.startswith("6.12.")
    assert k612.config_sha256 == hashlib.sha256(k612.config.read_bytes()).hexdigest()
    feats = k612.features()
    assert feats["KSM"] == "y" and feats["THP"] == "y" and feats["KPROBES"] == "y"
    assert "debian:6.12" in [k.name for k in kernels.cached()]


def test_unknown_versions_and_kernels_are_clear_errors():
    with pytest.raises(MmlabError, match=r"debian:5\.99: no Debian cloud kernel package"):
        kernels.resolve_debian("5.99")
    with pytest.raises(MmlabError, match=r"debian:six: expected debian:MAJOR\.MINOR"):
        kernels.resolve_debian("six")
    with pytest.raises(MmlabError, match=r"unknown kernel 'local:nope'.*mmlab kernels add"):
        kernels.get("local:nope")


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
    assert qemu._frames(good) == {"stdout": b"hello"}
    with pytest.raises(TrialFailed, match="corrupted"):
        qemu._frames(good.replace(base64.b64encode(data).decode(),
                                  base64.b64encode(b"hellO").decode()))


def test_a_trial_runs_in_the_guest_with_its_settings(k612):
    guest = qemu.Guest(k612, vcpus=1, memory_mb=256, timeout_s=120)
    samples = qemu.run(guest, workloads.get("pageout-refault"), {**TINY, "thp": "hugepage"},
                       samples=2, warmups=0, settings=HostSettings(thp="always"))
    assert len(samples) == 2
    for s in samples:
        assert s.state["kernel"] == k612.version            # measured inside the guest
        assert s.state["thp_enabled"] == "always"           # the arm's setting, in the guest
        assert s.state["accelerator"] in ("kvm", "tcg") and s.state["target"] == "qemu"
        assert s.metrics["cycle_ns_per_page"] > 0


def test_a_broken_command_line_is_a_failed_trial_with_the_console(k612):
    guest = qemu.Guest(k612, memory_mb=256, timeout_s=60, extra_cmdline="rdinit=/no/such/init")
    with pytest.raises(qemu.BootFailed, match=r"kernel panic in the guest.*console: "):
        qemu.run(guest, workloads.get("pageout-refault"), TINY, 1, 0, HostSettings())


def test_a_hung_guest_is_killed_and_reported(k612):
    guest = qemu.Guest(k612, memory_mb=256, timeout_s=10)
    with pytest.raises(TrialFailed, match=r"guest hung: no result from debian:6\.12 after 10 s"):
        qemu.run(guest, workloads.get("mremap-churn"), {"seconds": 120}, 1, 0, HostSettings())


def test_kernel_axis_experiment_end_to_end(k612, tmp_path):
    proc, results = run_profile(tmp_path, """
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
kernel = ["debian:6.12", "local:nope"]
cpus = [1, 2]
""")
    assert proc.returncode == 0, proc.stderr
    assert "6 run now" in proc.stdout and "6 failed" in proc.stdout
    assert "unknown kernel 'local:nope'" in proc.stdout
    assert "TCG" in proc.stdout or "KVM" in proc.stdout          # the accelerator is named
    rows = json.loads(mmlab("compare", "1", "--results", str(results), "--json").stdout)
    ok = [r for r in rows if r["arm"] == "kernel=debian:6.12,cpus=2"]
    assert ok and ok[0]["baseline"] == "kernel=debian:6.12,cpus=1" and ok[0]["ratio"] > 0
    failed = [r for r in rows if r["arm"] == "kernel=local:nope,cpus=2"]
    assert failed and failed[0]["verdict"] == "unreliable"


def test_instrumented_guest_run_counts_and_times_kernel_functions(k612):
    """The no-swap MADV_PAGEOUT chain of seed 001: every folio asks for swap."""
    proc = mmlab("run", "pageout-refault", "--kernel", "debian:6.12", "--memory-mb", "256",
                 "--reps", "1", "--mapping-kb", "1024", "--rounds", "2", "--min-ms", "0", "--json",
                 "--trace-count", "folio_alloc_swap", "--trace-time", "reclaim_pages")
    assert proc.returncode == 0, proc.stderr
    (s,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert s["state"]["instrumented"] == 1
    rounds = 2 * 2                                   # a warm-up sample and a measured one
    assert s["counts"]["trace_calls.folio_alloc_swap"] >= 256 * rounds
    assert s["counts"]["trace_timed_calls.reclaim_pages"] >= rounds
    assert s["counts"]["trace_max_us.reclaim_pages"] > 0


def test_a_broken_cmdline_in_a_profile_is_a_failed_trial(k612, tmp_path):
    proc, _ = run_profile(tmp_path, """
name = "broken"
workload = "pageout-refault"
kernel = "debian:6.12"
cmdline = "rdinit=/no/such/init"
memory_mb = 256
repetitions = 3
metrics = ["advise_ns_per_page"]
baseline = "A"
[params]
mapping-kb = 1024
[[arms]]
name = "A"
""", timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "3 failed" in proc.stdout and "kernel panic in the guest" in proc.stdout


def test_an_oom_kill_in_the_guest_is_a_failed_trial(k612):
    guest = qemu.Guest(k612, vcpus=1, memory_mb=256, timeout_s=120)
    params = {"backing": "anon", "workers": 4, "size-kb": 60000, "rounds": 1, "min-ms": 0}
    with pytest.raises(TrialFailed, match=r"killed by the OOM killer in the guest: Out of memory"):
        qemu.run(guest, workloads.get("unmap-young"), params, 1, 0, HostSettings())


def test_missing_trace_functions_are_skipped_not_fatal(k612):
    guest = qemu.Guest(k612, memory_mb=256, timeout_s=120)
    instrument = qemu.Instrumentation(count=("no_such_function_mmlab", "folio_alloc_swap"))
    (s,) = qemu.run(guest, workloads.get("pageout-refault"), TINY, 1, 0, HostSettings(),
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
    rows = {(figure, func): value for figure, func, value, _ in g["rows"]}
    first = workloads.get("pageout-refault").mm_paths[0]       # counted and timed by default
    assert rows[("calls", first)] > 0 and rows[("timed_calls", first)] > 0
    assert g["accelerator"] in ("tcg", "kvm")
