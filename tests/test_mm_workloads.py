"""The mm-family workloads beyond the seeds: each variant runs once on this
kernel with tiny parameters and prints a sample whose timed windows were
counted, whose metrics are real figures, whose page-state probes are there,
and which no failed call spoiled; `mmwork describe` gives each its windows
and mm paths."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from mmlab import workloads
from mmlab.workloads import mmwork
from mmlab.workloads.samples import Sample

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
