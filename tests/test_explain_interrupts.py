"""`explain` shows the interrupts taken inside each syscall's stay, which the
plugin counts apart from every function's inclusive count: beside the
entry function's count, so the stay is its entry function, its interrupts
and the rest (entry and exit code, other tasks' runs), and the three add
up; a record counted before the interrupts were taken out shows none."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmlab.attribution import explain
from mmlab.attribution.functions import FunctionInsns
from mmlab.report import data, fmt, html, text
from mmlab.store import Store

from .conftest import mmlab
from .test_count_labels import counted_store

# debian:6.12, one vCPU, one munmap of 32 MiB (8,192 pages): a stay of
# 9,445,980 instructions, 43 ticks of 137,517, do_syscall_64 9,278,895
# inclusively (docs/instructions.md), here per page and at the entry function.
PAGES = 8192.0
STAY, TICKS, TICK_INSNS, ENTRY = 9_445_980.0, 43.0, 137_517.0, 9_270_000.0


def munmap(interrupts: bool, scale: float = 1.0) -> FunctionInsns:
    """One window's record of that munmap: its path, stay, and (with
    `interrupts`, as the plugin counts since it takes them out of the
    functions) the interrupts inside it."""
    path = {"__x64_sys_munmap": ENTRY * scale / PAGES, "unmap_page_range": 0.6 * ENTRY / PAGES}
    return FunctionInsns(
        windows={"unmap": {"unmap_page_range": 900.0}}, kernel={"unmap": STAY / PAGES},
        unresolved={"unmap": 0.0}, units={"unmap": "page"}, kernel_release="6.12",
        text_address=0, paths={"unmap": {"syscall_munmap": path}},
        stays={"unmap": {"syscall_munmap": [1 / PAGES, STAY * scale / PAGES]}},
        interrupts={"unmap": {"syscall_munmap": [TICKS / PAGES, TICK_INSNS / PAGES]}}
        if interrupts else {})


def test_the_interrupts_inside_a_stay_are_shown_and_the_stay_adds_up():
    """Before, the line said only that the stay also held "interrupts", with
    no figure: the 137,517 instructions of 43 ticks were in no count shown."""
    (w,) = explain.explain_functions("6.12", munmap(True))
    (p,) = w.paths
    assert p.interrupts == pytest.approx((TICKS / PAGES, TICK_INSNS / PAGES))
    rest = p.rest()
    assert rest == pytest.approx((STAY - ENTRY - TICK_INSNS) / PAGES)
    assert p.per_unit + p.interrupts[1] + rest == pytest.approx(p.stay_per_unit)
    line = fmt.call_path(p, w.unit)
    assert p.taken_per_call() == pytest.approx(TICKS)     # one munmap, 43 ticks in it
    assert (f"interrupts inside it, in none of its functions' counts: "
            f"{fmt.num(p.taken_per_call())}"
            f" taken per call, {fmt.num(TICK_INSNS / PAGES)} instructions /page") in line
    assert (f"the whole syscall_munmap stay {fmt.num(STAY / PAGES)} /page is __x64_sys_munmap, "
            f"its interrupts and {fmt.num(rest)} more: the kernel entry and exit code") in line


def test_a_stay_without_interrupts_shows_zero_and_a_record_from_before_none():
    quiet = munmap(True).model_copy(update={"interrupts": {"unmap": {}}})
    (p,) = explain.explain_functions("6.12", quiet)[0].paths
    assert p.interrupts == (0.0, 0.0)
    assert "0 taken per call, 0 instructions /page" in fmt.call_path(p, "page")
    (old,) = explain.explain_functions("6.12", munmap(False))[0].paths
    assert old.interrupts is None and old.rest() is None
    line = fmt.call_path(old, "page")
    assert "taken" not in line and "interrupts and other tasks' runs inside" in line


def test_a_pair_shows_both_sides_and_says_a_side_counted_before_has_none():
    (w,) = explain.explain_functions("6.12", munmap(True, 1.1), "6.1", munmap(True))
    (p,) = w.paths
    assert p.interrupts_baseline == p.interrupts and p.rest(True) == pytest.approx(
        (STAY - ENTRY - TICK_INSNS) / PAGES)
    rests = f"{fmt.num(p.rest(True))} -> {fmt.num(p.rest())} more"
    assert rests in fmt.call_path(p, w.unit)
    (mixed,) = explain.explain_functions("6.12", munmap(True), "6.1", munmap(False))[0].paths
    line = fmt.call_path(mixed, "page")
    assert f"{fmt.DASH} -> 43 taken per call, {fmt.DASH} -> 16.79 instructions" in line
    assert "counted before interrupts were taken out of the functions" in line


def stored(tmp_path: Path) -> Path:
    """A counted experiment (the fake target) whose arms' attribution is
    that munmap's, 6.12's record with its interrupts, 6.1's from before."""
    results = counted_store(tmp_path, functions=1.0)
    store = Store(results)
    for arm in store.measurements(1).by_arm:
        f = munmap("6.12" in arm, 1.1 if "6.12" in arm else 1.0)
        store.save_attribution(1, arm, "functions", f.model_dump())
    return results


def test_explain_and_the_reports_print_the_interrupts_with_the_path(tmp_path):
    results = stored(tmp_path)
    explained = mmlab("explain", "1", "--results", str(results))
    told = " ".join(explained.stdout.split())
    assert explained.returncode == 0, explained.stderr
    assert f"{fmt.DASH} -> 43 taken per call" in told
    assert "in none of its functions' counts" in told
    d = data.gather(Store(results), 1)
    assert "in none of its functions' counts" in " ".join(text.render(d).split())
    assert "in none of its functions&#39; counts" in html.render(d)
