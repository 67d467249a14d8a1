"""The guest states audit judges what the tracker judges: not the counts the
host's clock paces (one definition, workloads.clock_paced), with the count
rule's floor of each metric, and a window's functions by the window the
metric names (the longest name it starts with)."""

from __future__ import annotations

from mmlab.judge import audit, criteria, states
from mmlab.workloads import CLOCK_STAYS, PATH_STAY, STAY, clock_paced, is_count
from mmlab.workloads.samples import Sample

from .fake_target import RUSAGE


def _boots(metric: str, *values: tuple[str, list[float]]) -> list[Sample]:
    return [Sample(workload="w", sample=0, mmwork_version="1", params={},
                   metrics={metric: v}, counts={}, rusage=RUSAGE, vmstat_delta={},
                   state={"guest_state": state}, errors={})
            for state, vs in values for v in vs]


def test_the_clock_paced_entries_are_no_states_finding_and_a_paths_are():
    """`w_other_calls` +39% between boots (as reproduced): the unnamed
    entries follow the host's clock as interrupts do; a syscall's calls apart
    as much are a finding."""
    for metric in ("w_other_calls", "w_other_kernel_insns_per_call",
                   "w_interrupt_calls", "w_interrupt_kernel_insns_per_page"):
        assert is_count(metric) and clock_paced(metric)
        assert audit.states_differ("x", _boots(metric, ("0:a", [23, 23]),
                                                ("1:b", [32, 32]))) == [], metric
    path = "w_syscall_mprotect_calls"
    assert not clock_paced(path)
    (f,) = audit.states_differ("x", _boots(path, ("0:a", [23, 23]), ("1:b", [32, 32])))
    assert path in str(f)


def test_the_clock_stays_are_the_stays_off_a_path():
    """One definition: a stay is on a path (the tracker follows it) or the
    clock's (neither follows nor audits it), never both, never neither."""
    for stay in ("syscall_mprotect", "fault", "exception_gp", *CLOCK_STAYS):
        assert STAY.fullmatch(stay)
        on_path = bool(PATH_STAY.fullmatch(stay))
        assert on_path != clock_paced(f"map_fault_{stay}_calls"), stay
        assert on_path != clock_paced(f"map_{stay}_kernel_insns_per_call"), stay
    assert not clock_paced("other_kernel_insns_per_page")   # a window named other


def test_a_paths_boots_apart_beyond_its_floor_are_named_a_windows_are_not():
    """0.5% apart with no own spread: beyond a path's floor (0.25%), within
    a whole window's (1%), as the count rule judges a step between kernels."""
    path, window = "w_syscall_mprotect_kernel_insns_per_call", "w_kernel_insns_per_page"
    (f,) = audit.states_differ("x", _boots(path, ("0:a", [1000, 1000]), ("1:b", [1005, 1005])))
    assert path in str(f)
    assert audit.states_differ("x", _boots(window, ("0:a", [1000, 1000]),
                                           ("1:b", [1005, 1005]))) == []
    assert states.floor_of(path) == criteria.COUNT_FLOORS["path"] < \
        states.floor_of(window) == criteria.COUNT_FLOORS["window"]


def test_a_difference_the_boots_explain_is_judged_by_the_metrics_floor():
    path = "w_syscall_mprotect_kernel_insns_per_call"
    a = _boots(path, ("0:a", [1000, 1000]), ("1:b", [1010, 1010]))
    b = _boots(path, ("0:c", [1005, 1005]), ("1:d", [1005, 1005]))
    # The arms' medians 1005 and 1005: no difference to explain.
    assert audit.states_explain("a", "b", a, b) == []
    c = _boots(path, ("0:c", [1008, 1008]), ("1:d", [1008, 1008]))
    # 0.3% apart, inside a's boots' range: beyond a path's floor, explained.
    (f,) = audit.states_explain("a", "c", a, c)
    assert f.matters_for(path)
    window = "w_kernel_insns_per_page"
    aw = _boots(window, ("0:a", [1000, 1000]), ("1:b", [1030, 1030]))
    cw = _boots(window, ("0:c", [1023, 1023]), ("1:d", [1023, 1023]))
    assert audit.states_explain("a", "c", aw, cw) == []    # 0.3%: within a window's 1%


def test_a_finding_names_so_many_counts_and_counts_the_rest(monkeypatch):
    metrics = [f"w_syscall_s{k}_calls" for k in range(5)]
    samples = [s for k, m in enumerate(metrics)
               for s in _boots(m, ("0:a", [10, 10]), ("1:b", [20 + k, 20 + k]))]
    assert "and 2 more counts" in states.disagree(samples)
    monkeypatch.setattr(states, "NAMED_COUNTS", 1)
    text = states.disagree(samples)
    assert "and 4 more counts" in text and text.count("from boot") == 1


def test_a_metrics_functions_come_from_the_window_it_names():
    """Exec windows map and map_fault: a map_fault count names map_fault's
    functions, not map's."""
    boot0 = {"map": {"do_mmap": 100.0}, "map_fault": {"clear_page_erms": 500.0}}
    boot1 = {"map": {"do_mmap": 190.0}, "map_fault": {"clear_page_erms": 540.0}}
    text = states.functions_apart({"0": boot0, "1": boot1}, "0:a", "1:b",
                                  "map_fault_kernel_insns_per_page")
    assert "(map_fault, per unit)" in text and "clear_page_erms +40" in text
    assert "do_mmap" not in text
    text = states.functions_apart({"0": boot0, "1": boot1}, "0:a", "1:b",
                                  "map_kernel_insns_per_page")
    assert "(map, per unit)" in text and "do_mmap +90" in text
