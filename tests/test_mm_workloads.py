"""The mm-family workloads beyond the seeds: each variant the host can run,
once, with tiny parameters, through mmlab's own runner, printing a sample
whose timed windows were counted, whose metrics are real figures, whose
page-state probes are there and which no failed call spoiled; what needs a
machine the host is not (two NUMA nodes) refuses in one line; `mmwork
describe` gives each its windows and mm paths."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from mmlab import workloads
from mmlab.workloads import mmwork
from mmlab.workloads.build import mmwork_path
from mmlab.workloads.samples import Sample

from .conftest import is_root
from .conftest import mmwork as run_mmwork

THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str:
    if not THP_ENABLED.exists():
        return "absent"
    return THP_ENABLED.read_text().split("[")[1].split("]")[0]


def run_one(name: str, params: dict[str, object]) -> Sample:
    """One measured sample, no warm-up, windows counted (--insns)."""
    wl = workloads.get(name)
    (sample,) = mmwork.sample(wl, {**params, "insns": True}, samples=1, warmups=0)
    return sample


def check_sample(s: Sample, name: str, windows: tuple[str, ...],
                 state: tuple[str, ...]) -> None:
    """Every metric a finite positive figure the table declares; each used
    window counted with its units; the probes' state there; no errors."""
    wl = workloads.get(name)
    assert s.workload == name and not s.errors, s.errors
    assert s.metrics and set(s.metrics) <= {m.name for m in wl.metrics}
    for metric, value in s.metrics.items():
        assert value is not None and math.isfinite(value) and value > 0, (metric, value)
    for w in windows:
        assert s.counts[f"{w}_windows"] >= 1 and s.counts[f"{w}_units"] > 0, w
    for key in ("mapping_start_mod_2m_kb", "mapping_pmd_aligned_fraction", "thp_enabled",
                *state):
        assert key in s.state, key


# ---------------------------------------------------------------- fault, mprotect, mremap

MINE = ("page-fault", "mprotect", "mremap-ops", "munmap-zap")
QUICK = {"rounds": 2, "min-ms": 0}

PAGE_FAULT = {
    "anon-write": {"backing": "anon"},
    "anon-read": {"backing": "anon", "access": "read"},
    "anon-write-nohugepage": {"backing": "anon", "thp": "nohugepage"},
    "anon-write-hugepage": {"backing": "anon", "thp": "hugepage", "size-kb": 2048},
    "anon-read-hugepage": {"backing": "anon", "thp": "hugepage", "access": "read",
                           "size-kb": 2048},
    "file-write": {"backing": "file"},
    "file-read": {"backing": "file", "access": "read"},
    "file-private-write": {"backing": "file-private"},
    "file-private-read": {"backing": "file-private", "access": "read"},
    "shmem-write": {"backing": "shmem"},
    "shmem-read": {"backing": "shmem", "access": "read"},
    "anon-write-2-threads": {"backing": "anon", "threads": 2},
    "file-read-2-threads": {"backing": "file", "access": "read", "threads": 2},
}


@pytest.mark.parametrize("variant", PAGE_FAULT)
def test_page_fault_variant(variant, tmp_path):
    params = {"size-kb": 512, **QUICK, **PAGE_FAULT[variant]}
    if str(params["backing"]).startswith("file"):
        params["dir"] = str(tmp_path)
    s = run_one("page-fault", params)
    check_sample(s, "page-fault", ("fault",),
                 ("thp_backed_fraction", "after_fault_rss_kb", "after_fault_anon_huge_kb"))
    threads = int(params.get("threads", 1))
    pages = int(params["size-kb"]) // 4
    assert s.counts["threads"] == threads and s.counts["fault_units"] == pages / threads
    assert s.counts["fault_windows"] == threads * s.counts["rounds"]
    assert s.counts["pages"] == pages * s.counts["rounds"]
    if variant == "anon-write-nohugepage":      # one fault per 4 KiB page
        # exactly one fault a page, but for the few a page-table page or a
        # stray kernel thread's fault adds over a 4 MiB mapping: under 5%
        assert s.counts["faults_per_page"] == pytest.approx(1, abs=0.05)
        assert s.state["thp_backed_fraction"] == 0
    if variant == "anon-read":                  # the zero page: nothing resident
        assert s.state["after_fault_anon_kb"] == 0
    if str(params["backing"]).startswith("file"):
        assert "file_fs_magic" in s.state
        assert list(tmp_path.iterdir()) == []   # the file was unlinked


MPROTECT = {
    "private-dirty-full": {},
    "private-clean-full": {"page-state": "clean"},
    "shared-dirty-full": {"mapping": "shared"},
    "shared-clean-alternate": {"mapping": "shared", "page-state": "clean",
                               "range": "alternate"},
    "private-dirty-alternate": {"range": "alternate"},
    "private-dirty-full-hugepage": {"thp": "hugepage", "size-kb": 2048},
    "private-dirty-alternate-hugepage": {"thp": "hugepage", "range": "alternate",
                                         "size-kb": 2048},
}


@pytest.mark.parametrize("variant", MPROTECT)
def test_mprotect_variant(variant):
    params = {"size-kb": 512, **QUICK, **MPROTECT[variant]}
    s = run_one("mprotect", params)
    check_sample(s, "mprotect", ("protect", "unprotect"),
                 ("thp_backed_fraction", "after_touch_rss_kb", "after_protect_vmas",
                  "after_unprotect_vmas"))
    pages = int(params["size-kb"]) // 4
    alternate = params.get("range") == "alternate"
    assert s.counts["calls_per_round"] == (pages // 2 if alternate else 1)
    assert s.counts["protect_units"] == s.counts["unprotect_units"] == pages
    # Every other page split off, then all merged back into one VMA.
    assert s.state["after_protect_vmas"] == (pages if alternate else 1)
    assert s.state["after_unprotect_vmas"] == 1


MREMAP = {
    "move": {"op": "move"},
    "move-pte-by-pte": {"op": "move", "dst-offset-kb": 4},
    "move-hugepage": {"op": "move", "thp": "hugepage", "size-kb": 2048},
    "grow": {"op": "grow"},
    "shrink": {"op": "shrink"},
    "shrink-hugepage": {"op": "shrink", "thp": "hugepage", "size-kb": 4096},
}


@pytest.mark.parametrize("variant", MREMAP)
def test_mremap_ops_variant(variant):
    params = {"size-kb": 512, **QUICK, **MREMAP[variant]}
    op = str(params["op"])
    s = run_one("mremap-ops", params)
    check_sample(s, "mremap-ops", (op,), ("thp_backed_fraction", "before_rss_kb",
                                          "after_rss_kb", "after_vmas"))
    kb = int(params["size-kb"])
    per = "op" if op == "grow" else "page"
    assert set(s.metrics) == {f"{op}_ns_per_{per}", f"{op}_ns_per_{per}_total"}
    assert s.counts[f"{op}_units"] == {"move": kb // 4, "grow": 1, "shrink": kb // 8}[op]
    # What is mapped after the call: all of it moved, doubled in place (the
    # grown half not touched), or half of it.
    assert s.state["after_vmas"] == 1
    assert s.state["after_rss_kb"] == (kb // 2 if op == "shrink" else kb)


ZAP = {
    "munmap": {"op": "munmap"},
    "dontneed": {"op": "dontneed"},
    "munmap-hugepage": {"op": "munmap", "thp": "hugepage", "size-kb": 2048},
    "dontneed-hugepage": {"op": "dontneed", "thp": "hugepage", "size-kb": 2048},
}


@pytest.mark.parametrize("variant", ZAP)
def test_munmap_zap_variant(variant):
    params = {"size-kb": 512, **QUICK, **ZAP[variant]}
    s = run_one("munmap-zap", params)
    check_sample(s, "munmap-zap", ("zap",), ("thp_backed_fraction", "before_zap_rss_kb"))
    assert s.counts["zap_units"] == int(params["size-kb"]) // 4
    if params["op"] == "dontneed":              # the pages are gone, the VMA stays
        assert s.state["after_zap_rss_kb"] == 0 and s.state["after_zap_vmas"] == 1


def test_hugepage_variants_are_thp_backed_where_thp_can_be():
    if thp_mode() not in ("always", "madvise"):
        pytest.skip(f"THP is '{thp_mode()}' here: MADV_HUGEPAGE cannot get huge pages")
    s = run_one("munmap-zap", {"size-kb": 2048, **QUICK, "thp": "hugepage"})
    assert s.state["thp_backed_fraction"] > 0.5 and s.state["before_zap_anon_huge_kb"] > 0
    f = run_one("page-fault", {"size-kb": 2048, **QUICK, "thp": "hugepage"})
    assert f.state["thp_backed_fraction"] > 0.5 and f.counts["faults_per_page"] < 0.1


def test_describe_gives_each_its_windows_mm_paths_and_help():
    table = workloads.registry()
    for name in MINE:
        wl = table[name]
        assert wl.windows and wl.mm_paths and wl.vmstat and wl.summary and wl.seed, name
        assert all(w.unit in ("page", "op") and w.help for w in wl.windows), name
        assert all(p.help for p in wl.params), name
        assert all(p.min is not None and p.max is not None and p.min <= p.max
                   for p in wl.params if p.type in ("int", "size_kb", "bytes")), name
        assert all(m.help and m.direction in ("higher", "lower") for m in wl.metrics), name
        assert wl.window_metrics() <= {m.name for m in wl.metrics}, name
    assert {p.name for p in table["page-fault"].params} >= {"backing", "access", "thp",
                                                             "threads", "size-kb"}
    assert table["mremap-ops"].param("op").choices == ("move", "grow", "shrink")


@pytest.mark.parametrize("args, message", [
    (("page-fault", "--size-kb", "64", "--threads", "17"), "--threads 17 is more than"),
    (("page-fault", "--backing", "hugetlb"), "--backing: 'hugetlb' is not one of"),
    (("mremap-ops", "--dst-offset-kb", "4096"), "--dst-offset-kb: 4096 is outside"),
])
def test_bad_arguments_exit_2_with_one_line(args, message):
    proc = run_mmwork(*args, "--check")
    assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[0]


# ---------------------------------------------------------------- madvise, mincore, mlock,
# msync, fork, migration (and userfaultfd, hugetlb)

TINY = {"mapping-kb": 1024, "rounds": 2, "min-ms": 0}


def mm_run_one(name: str, params: dict) -> Sample:
    """One sample, no warm-up, with the windows counted (--insns): every
    sample then says how many windows ran and the units of one."""
    (s,) = mmwork.sample(workloads.get(name), {**TINY, **params, "insns": True}, samples=1,
                         warmups=0)
    return s


def mm_check_sample(s: Sample, windows: dict[str, float], thp: bool = True) -> None:
    """Metrics finite and positive, each window counted once a round with
    its units, no failed call, the page state every sample carries."""
    assert s.metrics and not s.errors, (s.metrics, s.errors)
    for name, value in s.metrics.items():
        assert value is not None and math.isfinite(value) and value > 0, (name, value)
    rounds = s.counts["rounds"]
    for window, units in windows.items():
        assert s.counts[f"{window}_windows"] == rounds, window
        assert s.counts[f"{window}_units"] == units, window
    assert s.counts["pages"] == rounds * TINY["mapping-kb"] // 4
    assert {"thp_enabled", "kernel"} <= s.state.keys()
    assert not thp or {"mapping_start_mod_2m_kb", "thp_backed_fraction"} <= s.state.keys()


PAGES = TINY["mapping-kb"] // 4
MM_FAMILY = ("madvise", "mincore-mlock", "fork-cow", "migrate", "uffd", "hugetlb-fault")


def test_describe_lists_windows_mm_paths_and_variants():
    described = {w["name"]: w for w in json.loads(run_mmwork("describe").stdout)}
    variants = {"madvise": ("advice", 10), "mincore-mlock": ("op", 4), "fork-cow": ("child", 2),
                "migrate": ("op", 3), "uffd": ("resolve", 2), "hugetlb-fault": ("sharing", 2)}
    for name in MM_FAMILY:
        w = described[name]
        assert w["mm_paths"] and w["vmstat"] and all(x["unit"] == "page" for x in w["windows"])
        metrics = {m["name"] for m in w["metrics"]}
        for x in w["windows"]:
            assert {x["kernel_metric"], x["user_metric"], f"{x['name']}_ns_per_page"} <= metrics
        assert all(p["help"] for p in w["params"]) and all(m["help"] for m in w["metrics"])
        assert all("min" in p and p["max"] >= p["min"] for p in w["params"]
                   if p["type"] in ("int", "size_kb", "bytes"))
        param, n = variants[name]
        assert len(next(p for p in w["params"] if p["name"] == param)["choices"]) == n
    assert [x["name"] for x in described["fork-cow"]["windows"]] == ["fork", "cow", "exit"]
    assert described["hugetlb-fault"]["host_settings"] == ["/proc/sys/vm/nr_hugepages"]


@pytest.mark.parametrize("advice, backing", [
    ("dontneed", "auto"), ("free", "auto"), ("cold", "auto"), ("pageout", "auto"),
    ("willneed", "auto"), ("populate-read", "auto"), ("populate-write", "auto"),
    ("process-cold", "auto"), ("process-pageout", "auto"),
    ("dontneed", "shmem"), ("willneed", "shmem"), ("pageout", "file"),
    ("remove", "auto"), ("remove", "shmem"),
])
def test_madvise_variant(advice, backing, tmp_path):
    s = mm_run_one("madvise", {"advice": advice, "backing": backing, "dir": str(tmp_path),
                            "thp": "nohugepage"})
    mm_check_sample(s, {"advise": PAGES})
    st, kb = s.state, TINY["mapping-kb"]
    auto = "file" if advice in ("willneed", "remove") else "anon"
    assert st["backing"] == (auto if backing == "auto" else backing)
    if advice.startswith("populate"):      # from an empty range to every page mapped
        assert st["before_advise_rss_kb"] == 0 and st["after_advise_resident_fraction"] == 1
    else:
        assert st["before_advise_rss_kb"] == kb or advice == "willneed"
    if advice in ("dontneed", "remove"):     # remove: a hole punched where it was mapped
        assert st["after_advise_rss_kb"] == 0
    if advice == "free":
        assert s.vmstat_delta["pglazyfree"] >= s.counts["pages"]
    if advice == "willneed" and st["backing"] == "file" and st["dir_fs"] not in ("tmpfs", "ramfs"):
        # The page cache was dropped before the call; its readahead brings it back.
        assert st["before_advise_resident_fraction"] == 0
        assert st["after_advise_resident_fraction"] > 0.5
    assert list(tmp_path.iterdir()) == []  # the file was unlinked


@pytest.mark.parametrize("op, backing", [
    ("mincore", "auto"), ("mlock", "auto"), ("munlock", "auto"), ("msync", "auto"),
    ("mincore", "file"), ("munlock", "shmem"),
])
def test_mincore_mlock_variant(op, backing, tmp_path):
    s = mm_run_one("mincore-mlock", {"op": op, "backing": backing, "dir": str(tmp_path)})
    mm_check_sample(s, {"op": PAGES})
    st, kb = s.state, TINY["mapping-kb"]
    assert st["resident_fraction"] == 1 and st["after_op_rss_kb"] == kb
    locked = {"mincore": (0, 0), "mlock": (0, kb), "munlock": (kb, 0), "msync": (0, 0)}[op]
    assert (st["before_op_vmlck_kb"], st["after_op_vmlck_kb"]) == locked
    if op in ("mlock", "munlock"):
        assert s.vmstat_delta["unevictable_pgs_mlocked"] >= s.counts["pages"]
    if op == "msync" and st["dir_fs"] not in ("tmpfs", "ramfs"):
        assert s.vmstat_delta["nr_written"] >= s.counts["pages"]


@pytest.mark.parametrize("child", ["write", "exit"])
def test_fork_cow_variant(child):
    s = mm_run_one("fork-cow", {"child": child, "thp": "nohugepage"})
    windows = {"fork": PAGES, "exit": PAGES} | ({"cow": PAGES} if child == "write" else {})
    mm_check_sample(s, windows)
    assert ("cow_ns_per_page" in s.metrics) is (child == "write")
    assert s.state["parent_anon_kb"] == TINY["mapping-kb"]
    assert s.state["child_after_cow_anon_kb"] == TINY["mapping-kb"]


@pytest.mark.parametrize("resolve", ["copy", "zeropage"])
def test_uffd_variant(resolve):
    if run_mmwork("uffd", "--check").returncode:
        pytest.skip("no userfaultfd here (root or vm.unprivileged_userfaultfd = 1)")
    s = mm_run_one("uffd", {"resolve": resolve})
    mm_check_sample(s, {"fault": PAGES}, thp=False)
    assert s.counts["faults_resolved"] == s.counts["pages"]      # one ioctl per page
    # UFFDIO_COPY maps new pages; UFFDIO_ZEROPAGE the zero page, not in Rss.
    assert s.state["after_fault_rss_fraction"] == (1 if resolve == "copy" else 0)


@pytest.mark.skipif(not is_root(), reason="hugetlb-fault writes /proc/sys/vm/nr_hugepages")
def test_hugetlb_fault_is_checked_here_and_runs_in_a_guest():
    """The pool is a global setting: the host only checks the arguments;
    a guest runs it (mmlab run hugetlb-fault --target qemu ...)."""
    assert run_mmwork("hugetlb-fault", "--sharing", "shared", "--check").returncode == 0
    proc = run_mmwork("hugetlb-fault", "--mapping-kb", "3000", "--check")
    assert proc.returncode == 2 and "not a multiple of 2048" in proc.stderr


def test_migrate_on_one_node_fails_its_sample_in_one_line():
    """The arguments check passes (a profile's arms run in two-node guests);
    a sample on a machine of one memory node fails, saying how to run it."""
    assert run_mmwork("migrate", "--check").returncode == 0
    nodes = Path("/sys/devices/system/node/has_memory").read_text()
    proc = run_mmwork("migrate", "--mapping-kb", "256")
    if any(c in nodes for c in ",-"):        # two memory nodes here: it runs
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode != 0 and proc.stdout == ""
    line = proc.stderr.strip().splitlines()[0]
    assert "needs two NUMA nodes" in line and "numa_nodes = 2" in line


@pytest.mark.parametrize("args, message", [
    (("madvise", "--advice", "free", "--backing", "file"), "private anonymous memory only"),
    (("madvise", "--advice", "remove", "--backing", "anon"), "MADV_REMOVE on private memory"),
    (("mincore-mlock", "--op", "msync", "--backing", "anon"), "writes back a shared file"),
    (("fork-cow", "--child", "vfork"), "--child: 'vfork' is not one of"),
])
def test_impossible_variants_refuse_in_one_line(args, message):
    proc = run_mmwork(*args, "--check")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert message in line


@pytest.mark.skipif(not is_root() or not shutil.which("setpriv") or not shutil.which("prlimit"),
                    reason="drops CAP_IPC_LOCK with setpriv: root only")
def test_a_sample_whose_every_call_failed_fails():
    """Without CAP_IPC_LOCK and with a 64 KiB RLIMIT_MEMLOCK every mlock()
    fails: the sample is not printed and mmwork exits 1."""
    proc = subprocess.run(["setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock",
                           "prlimit", "--memlock=65536", str(mmwork_path()), "mincore-mlock",
                           "--op", "mlock", "--mapping-kb", "1024", "--rounds", "2",
                           "--min-ms", "0", "--warmups", "0"], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stdout == ""
    assert "sample 0 failed" in proc.stderr


# ---------------------------------------------------------------- in a guest

# reclaim is left to its variants' own counting boots below (one at its
# defaults would repeat the memcg-file one).
BROAD = [name for name, wl in workloads.registry().items()
         if wl.seed.startswith("none") and name != "reclaim"]


@pytest.fixture(scope="module")
def plugin() -> Path:
    from mmlab.kernels import qemu_plugin
    return qemu_plugin.ensure()


@pytest.mark.parametrize("name", BROAD)
def test_each_mm_family_workload_runs_and_is_counted_in_a_guest(name, k612, plugin):
    """One counting boot of each at its defaults in a debian:6.12 TCG guest
    (migrate in a guest of two NUMA nodes): no failed call, and every window
    that ran counted by the QEMU plugin in kernel instructions per unit."""
    from mmlab.machine.knobs import HostSettings
    from mmlab.targets import boot, qemu
    from mmlab.workloads import insns
    wl = workloads.get(name)
    guest = boot.Guest(k612, vcpus=1, memory_mb=512, numa_nodes=2 if name == "migrate" else 1,
                       timeout_s=300)
    (s,) = qemu.sample(guest, wl, insns.counting_params({}), 1, 0, HostSettings(), plugin=plugin)
    assert not s.errors, s.errors
    ran = [w for w in wl.windows if s.counts.get(f"{w.name}_windows")]
    assert ran, s.counts
    for w in ran:
        assert s.metrics[w.kernel_metric] > 0, (w.name, s.metrics)
    assert s.state["insns_source"] == "qemu tcg plugin"


# ---------------------------------------------------------------- reclaim

RECLAIM = {"memcg-file": {}, "memcg-anon": {"memory": "anon"},
           "global-file": {"pressure": "global"},
           "global-anon": {"pressure": "global", "memory": "anon"}}


def cgroup_v2_memory_here() -> bool:
    """Would a reclaim sample make its group on this machine: cgroup2 has
    the memory controller here, or nothing is mounted at /sys/fs/cgroup (it
    would mount cgroup2 there, as in a guest)?"""
    mounts = [line.partition(" - ") for line in
              Path("/proc/self/mountinfo").read_text().splitlines()]
    points = {left.split()[4]: right.split()[0] for left, _, right in mounts}
    for point, fstype in points.items():
        if fstype == "cgroup2":
            return "memory" in (Path(point) / "cgroup.controllers").read_text().split()
    return "/sys/fs/cgroup" not in points


def test_reclaim_is_described_with_its_window_paths_and_cgroup():
    w = next(w for w in json.loads(run_mmwork("describe").stdout) if w["name"] == "reclaim")
    assert [(x["name"], x["unit"]) for x in w["windows"]] == [("reclaim", "page")]
    metrics = {m["name"] for m in w["metrics"]}
    assert {"reclaim_ns_per_page", "reclaim_kernel_insns_per_page"} <= metrics
    params = {p["name"]: p for p in w["params"]}
    assert params["pressure"]["choices"] == ["memcg", "global"]
    assert params["memory"]["choices"] == ["file", "anon"]
    assert {"try_to_free_mem_cgroup_pages", "shrink_folio_list", "balance_pgdat",
            "do_swap_page", "filemap_read"} <= set(w["mm_paths"])
    assert "cgroup v2" in w["host_settings"][0] and w["scratch_disk"] is True
    assert workloads.get("reclaim").scratch_disk and not workloads.get("madvise").scratch_disk


@pytest.mark.parametrize("variant", RECLAIM)
def test_reclaim_variant_arguments_pass_the_check(variant):
    args = [a for k, v in RECLAIM[variant].items() for a in (f"--{k}", v)]
    assert run_mmwork("reclaim", *args, "--check").returncode == 0


@pytest.mark.parametrize("variant", RECLAIM)
def test_reclaim_without_a_cgroup_v2_memory_controller_fails_in_one_line(variant, tmp_path):
    """A cgroup v1 host gives no group of its own: every variant's sample
    fails saying why (an anon one first wants swap), and nothing is left
    in --dir."""
    if cgroup_v2_memory_here():
        pytest.skip("this machine has the cgroup v2 memory controller: a sample would make "
                    "a group here (the guest tests run it)")
    args = [a for k, v in RECLAIM[variant].items() for a in (f"--{k}", v)]
    proc = run_mmwork("reclaim", *args, "--dir", str(tmp_path), "--warmups", "0")
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    swap_kb = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                   if ln.startswith("SwapFree:"))
    if variant.endswith("anon") and swap_kb < 64 * 1024:
        assert "--memory anon needs swap for its working set" in line, line
    else:
        assert "needs the cgroup v2 memory controller" in line, line
        assert "run it in a guest" in line
    assert list(tmp_path.iterdir()) == []


def test_reclaim_refuses_a_file_on_tmpfs_before_it_changes_anything():
    """A tmpfs file's pages are shmem, which reclaim cannot drop without
    swap: refused in one line before any group is made."""
    if subprocess.run(["stat", "-f", "-c", "%T", "/dev/shm"], capture_output=True,
                      text=True).stdout.strip() != "tmpfs":
        pytest.skip("/dev/shm is not tmpfs here")
    proc = run_mmwork("reclaim", "--dir", "/dev/shm", "--warmups", "0")
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert "--dir /dev/shm is tmpfs, whose pages reclaim cannot drop" in line


def test_a_guest_gives_reclaim_a_disk_backed_var_tmp(k612):
    """The guest's /var/tmp is its initramfs (tmpfs) unless the workload
    asks for a scratch disk: a zram disk made ext2 and mounted there, with
    zram's module loaded once, by the swap when it has one."""
    from mmlab.machine.knobs import HostSettings
    from mmlab.targets import initramfs, qemu
    wl, cache = workloads.get("reclaim"), Path("/nonexistent")
    script = qemu.trial_script(wl, {}, 1, 0, HostSettings(), kernel=k612)
    lines = script.splitlines()
    assert lines.index("mount -t ext4 /dev/$zram /var/tmp") > \
        next(i for i, ln in enumerate(lines) if ln.startswith("mke2fs -q -b 4096"))
    assert "insmod /lib/modules/mmlab/zram.ko || true" in lines
    assert qemu._archives(wl, {}, k612, None, cache) == (initramfs.modules_archive(k612),)
    swapped = qemu.trial_script(wl, {}, 1, 0, HostSettings(swap="zram:64M"), kernel=k612)
    assert swapped.count("insmod /lib/modules/mmlab/zram.ko") == 1
    assert swapped.index("swapon /dev/zram0") < swapped.index("/sys/class/zram-control/hot_add")
    assert qemu._archives(wl, {}, k612, "zram:64M", cache) == ()   # the swap's bring them
    other = qemu.trial_script(workloads.get("madvise"), {}, 1, 0, HostSettings(), kernel=k612)
    assert "mke2fs" not in other and "/var/tmp" not in other
    assert qemu._archives(workloads.get("madvise"), {}, k612, None, cache) == ()


GUEST_RECLAIM = {  # (guest memory in MiB, swap) per variant; global: the guest's memory
    "memcg-file": (512, None), "memcg-anon": (512, "zram:256M"),
    "global-file": (256, None), "global-anon": (256, "zram:512M")}


# The global variants reclaim the guest's whole memory (about 20 s each):
# they run in `make test-slow`, the memcg ones in every `make test`.
@pytest.mark.parametrize("variant", [pytest.param(v, marks=pytest.mark.slow)
                                     if v.startswith("global") else v for v in RECLAIM])
def test_each_reclaim_variant_reclaims_where_it_should_in_a_guest(variant, k612, plugin):
    """One counting boot per variant in a debian:6.12 TCG guest: the passes
    reclaim from the group, the task itself under a memcg limit (kswapd
    never), kswapd mostly under global pressure; file pages dropped from a
    disk-backed --dir, anon pages swapped; every pass counted per page
    reclaimed."""
    from mmlab.machine.knobs import HostSettings
    from mmlab.targets import boot, qemu
    from mmlab.workloads import insns
    memory_mb, swap = GUEST_RECLAIM[variant]
    guest = boot.Guest(k612, vcpus=1, memory_mb=memory_mb, timeout_s=300)
    (s,) = qemu.sample(guest, workloads.get("reclaim"), insns.counting_params(RECLAIM[variant]),
                       1, 0, HostSettings(swap=swap), plugin=plugin)
    c = s.counts
    assert not s.errors and s.state["insns_source"] == "qemu tcg plugin", s.errors
    assert c["reclaim_windows"] == c["rounds"] and s.metrics["reclaim_kernel_insns_per_page"] > 0
    per = pytest.approx(c["pages_reclaimed"] / c["rounds"], rel=1e-4)     # 6 digits in JSON
    assert c["reclaim_units"] == per
    assert c["memcg_pgsteal_per_page"] == pytest.approx(c["pages_reclaimed"] / c["pages"],
                                                        rel=1e-4)
    if variant.startswith("memcg"):            # the whole working set, by the task alone
        # every page by the task itself; a page reclaimed twice (refaulted
        # under the limit) is the only way off 1, and is under 1%
        assert c["memcg_pgsteal_direct_per_page"] == pytest.approx(1, abs=0.01)
        assert c["memcg_pgscan_kswapd_per_page"] == 0
        assert s.state["memcg_current_kb"] <= s.state["memory_room_kb"]
    else:
        assert c["memcg_pgsteal_kswapd_per_page"] > c["memcg_pgsteal_direct_per_page"]
    if variant.endswith("file"):
        assert s.state["dir_fs"] == "ext4" and c["memcg_workingset_refault_file_per_page"] > 0.4
    else:
        assert c["memcg_pgmajfault_per_page"] > 0.4 and s.vmstat_delta["pswpout"] > 0
