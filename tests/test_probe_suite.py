"""The reporter's mprotect probe and its suite (experiments/mprotect-probe.toml,
experiments/suites/mprotect-probe.toml) read and plan as the tracker runs
them: every series from 6.12 against 6.12, counts alone (counting boots, the
count cells' rounds), the mprotect call's own series from the per-syscall
split of a program that marks nothing.  Pure Python: no guest is booted."""

from __future__ import annotations

from pathlib import Path

from mmlab.kernels import specs
from mmlab.track import cells, suite
from mmlab.workloads import insns

ROOT = Path(__file__).resolve().parents[1]
SERIES = ["debian:6.12", "debian:6.16", "debian:6.17", "debian:6.18", "debian:6.19",
          "debian:7.0", "debian:7.1", "debian:7.2", "debian:7.3"]


def test_the_probe_suite_reads_and_plans_counts_alone(monkeypatch):
    monkeypatch.setattr(specs, "expand", lambda names, apt=None: list(SERIES))
    found = suite.load(ROOT / "experiments" / "suites" / "mprotect-probe.toml")
    assert found.kernels[found.reference_slot] == "debian:6.12" and not found.branches
    (probe,) = found.profiles
    assert probe.metrics == ["command_kernel_insns_per_pages",
                             "command_syscall_mprotect_kernel_insns_per_call",
                             "command_syscall_mprotect_incl_change_protection_kernel_insns_per_"
                             "call"]         # a function on a path: the counting boots follow calls
    workload = probe.plan.workload
    assert workload.stay_parts("command_syscall_mprotect_kernel_insns_per_call") == \
        (workload.windows[0], "syscall_mprotect", "kernel_insns_per_call")
    assert insns.only(workload, probe.metrics)
    assert cells.cell_rounds(probe) == cells.COUNT_CELL_ROUNDS
    plan = cells.cell_plan(probe)
    assert plan.profile.repetitions == cells.COUNT_CELL_ROUNDS
    assert plan.profile.metrics == probe.metrics
    program = (ROOT / "experiments" / "repro" / "mprotect_probe.c").read_text()
    assert "mmlab.h" not in program and "MMLAB_" not in program    # no markers


def test_a_bundle_csv_holds_a_syscall_only_some_samples_made(tmp_path):
    """The probe's cells stored `wait4` in some samples only (mmwork's own
    wait, when a stay of it fell inside the window): the evidence bundle's
    raw.csv has its column, empty where a sample lacks it, where
    `track report` once stopped with a traceback."""
    from mmlab.report import csv as report_csv
    rows = [{"arm": "a", "metric.command_syscall_mprotect_calls": 2},
            {"arm": "b", "metric.command_syscall_mprotect_calls": 2,
             "metric.command_syscall_wait4_calls": 1}]
    report_csv.write(tmp_path / "raw.csv", rows)
    assert (tmp_path / "raw.csv").read_text().splitlines() == [
        "arm,metric.command_syscall_mprotect_calls,metric.command_syscall_wait4_calls",
        "a,2,", "b,2,1"]
