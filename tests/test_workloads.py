"""Each workload runs with small parameters on this kernel and prints samples
that follow the contract, with values a kernel could plausibly produce."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmlab import knobs, workloads
from mmlab.samples import parse_line

from .conftest import is_root, mmwork, samples_of

CONTRACT_KEYS = {"workload", "sample", "params", "metrics", "counts", "rusage", "vmstat_delta",
                 "state", "errors"}
COMMON_STATE = {"thp_enabled", "swap_total_kb", "swap_used_kb", "ksm_run", "kernel",
                "page_size_kb", "lru_gen_enabled"}


def check_contract(sample: dict, workload: str) -> None:
    assert CONTRACT_KEYS <= sample.keys()
    assert sample["workload"] == workload
    assert COMMON_STATE <= sample["state"].keys()
    wl = workloads.get(workload)
    assert {m.name for m in wl.metrics} >= sample["metrics"].keys()
    assert set(sample["vmstat_delta"]) <= set(wl.vmstat)
    parse_line(__import__("json").dumps(sample))  # the Python-side contract too


def test_registry_has_the_five_seed_workloads():
    table = workloads.registry()
    assert set(table) == {"pageout-refault", "mremap-churn", "populate-unmap", "unmap-young",
                          "ksm-rmap"}
    for wl in table.values():
        assert wl.metrics and wl.mm_paths and wl.seed
        assert all(m.direction in ("higher", "lower") for m in wl.metrics)
    assert workloads.get("pageout-refault").param("mapping-kb").default == "16384"
    assert workloads.get("ksm-rmap").metric("walk_trigger_ms").direction == "lower"
    assert workloads.get("mremap-churn").metric("ops_per_s_real").higher_is_better


def test_pageout_refault_nohugepage_is_not_thp_backed():
    (s,) = samples_of("pageout-refault", "--mapping-kb", "4096", "--thp", "nohugepage",
                      "--rounds", "2", "--min-ms", "0", "--warmups", "0")
    check_contract(s, "pageout-refault")
    m = s["metrics"]
    assert m["advise_ns_per_page"] > 0 and m["prefault_ns_per_page"] > 0
    assert m["cycle_ns_per_page"] == pytest.approx(
        m["advise_ns_per_page"] + m["post_touch_ns_per_page"], rel=1e-3)
    assert s["state"]["thp_backed_fraction"] == 0
    assert s["state"]["after_prefault_anon_kb"] == 4096
    assert s["counts"]["pages"] == 2 * 1024


def test_pageout_refault_hugepage_really_gets_thp():
    mode = knobs.read_setting(knobs.THP_ENABLED) if Path(knobs.THP_ENABLED).exists() else "absent"
    if mode not in ("always", "madvise"):
        pytest.skip(f"THP is '{mode}' on this machine: MADV_HUGEPAGE cannot get huge pages")
    (s,) = samples_of("pageout-refault", "--mapping-kb", "8192", "--thp", "hugepage",
                      "--rounds", "2", "--min-ms", "0", "--warmups", "0")
    assert s["state"]["after_prefault_anon_huge_kb"] > 0
    assert s["state"]["thp_backed_fraction"] > 0.5
    assert s["vmstat_delta"]["thp_fault_alloc"] > 0
    # No swap: reclaim could not swap the THPs out, so they were split and kept.
    if s["state"]["swap_total_kb"] == 0:
        assert s["state"]["after_pageout_anon_huge_kb"] == 0
        assert s["vmstat_delta"]["thp_split_page"] > 0


def test_mremap_churn_counts_ops_like_stress_ng():
    for numa in ((), ("--numa-move",)):
        (s,) = samples_of("mremap-churn", "--workers", "2", "--seconds", "0.3", *numa)
        check_contract(s, "mremap-churn")
        m, c = s["metrics"], s["counts"]
        assert c["ops"] > 100 and c["workers"] == 2
        assert m["ops_per_s_real"] == pytest.approx(c["ops"] / c["real_s"], rel=1e-3)
        assert m["sys_s"] > 0 and m["ops_per_s_cpu"] > 0
        assert s["params"]["numa-move"] is bool(numa)


def test_populate_unmap_times_both_halves():
    (s,) = samples_of("populate-unmap", "--workers", "1", "--bytes", "64K", "--seconds", "0.2")
    check_contract(s, "populate-unmap")
    assert s["metrics"]["populate_ns_per_page"] > s["metrics"]["unmap_ns_per_page"] > 0
    assert s["counts"]["pages"] == 16 * s["counts"]["ops"]


def test_unmap_young_marks_accessed_unless_sequential():
    """zap_pte_range() activates referenced inactive folios for young PTEs,
    except in VM_SEQ_READ mappings: pgactivate tells which path ran."""
    base = ("unmap-young", "--backing", "shmem", "--size-kb", "4096", "--rounds", "2",
            "--min-ms", "0", "--warmups", "0")
    (normal,) = samples_of(*base)
    (seq,) = samples_of(*base, "--sequential")
    check_contract(normal, "unmap-young")
    if normal["state"]["lru_gen_enabled"]:
        pytest.skip("MGLRU is on: folio_mark_accessed() does not activate")
    pages = normal["counts"]["pages"]
    assert normal["vmstat_delta"]["pgactivate"] >= 0.9 * pages
    assert seq["vmstat_delta"]["pgactivate"] < 0.1 * pages


def test_unmap_young_file_backing_cleans_up(tmp_path):
    (s,) = samples_of("unmap-young", "--backing", "file", "--dir", str(tmp_path), "--size-kb",
                      "1024", "--rounds", "1", "--min-ms", "0", "--warmups", "0")
    assert s["metrics"]["unmap_ns_per_page"] > 0
    assert list(tmp_path.iterdir()) == []  # the file was unlinked


@pytest.mark.skipif(not is_root() or not Path("/sys/kernel/mm/ksm/run").exists(),
                    reason="ksm-rmap needs root and a kernel with KSM")
def test_ksm_rmap_merges_splits_and_cleans_up():
    (s,) = samples_of("ksm-rmap", "--vmas", "400")
    check_contract(s, "ksm-rmap")
    assert s["state"]["vmas_actual"] >= 400          # mprotect split every page
    assert s["metrics"]["pages_sharing"] >= 200      # every data page merged
    assert s["counts"]["ksm_pages"] >= 1
    assert s["metrics"]["walk_trigger_ms"] > 0
    assert s["state"]["ksm_run"] == knobs_run_before()
    (holes,) = samples_of("ksm-rmap", "--vmas", "400", "--pattern", "holes", "--no-writer")
    assert holes["state"]["vmas_actual"] == 1        # MADV_DONTNEED never splits a VMA


def knobs_run_before() -> float:
    return float(Path("/sys/kernel/mm/ksm/run").read_text())


@pytest.mark.parametrize("args, message", [
    (("nope",), "unknown workload 'nope'"),
    (("pageout-refault", "--mapping-kb", "-5"), "--mapping-kb: -5 is outside"),
    (("pageout-refault", "--mapping-kb", "0"), "--mapping-kb: 0 is outside"),
    (("pageout-refault", "--mapping-kb", "99999999999"), "not below this machine's memory"),
    (("pageout-refault", "--thp", "sometimes"), "--thp: 'sometimes' is not one of"),
    (("mremap-churn", "--bytes", "-4K"), "--bytes: '-4K' is not a positive size"),
    (("mremap-churn", "--workers", "0"), "--workers: 0 is outside"),
    (("mremap-churn", "--seconds", "abc"), "--seconds: 'abc' is not a positive number"),
    (("unmap-young", "--dir", "/no/such/dir"), "--dir: '/no/such/dir' is not an existing"),
    (("ksm-rmap", "--frobnicate"), "unknown option '--frobnicate'"),
    (("pageout-refault", "--rounds"), "--rounds needs a value"),
])
def test_bad_arguments_give_one_line_and_exit_2(args, message):
    proc = mmwork(*args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
