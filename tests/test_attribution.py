"""Attribution: folding perf output, differencing arms, parsing the lock
tracepoints (on recorded text), and one live run with --attribute."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from mmlab.attribution import locks, stacks
from mmlab.machine import knobs

from .conftest import is_root, mmlab, run_profile

PERF_SCRIPT = """\
mmwork 17482/17482     333444 
\tffffffff815f98b4 unmap_page_range
\tffffffff8160b387 __x64_sys_munmap
\tffffffff82259cc1 do_syscall_64
\t           598b7 __munmap

mmwork 17483/17483     333444 
\tffffffff815b8430 lru_add_drain_cpu
\tffffffff815b8988 lru_add_drain
\tffffffff815f3742 populate_vma_page_range
\tffffffff82259cc1 do_syscall_64
\t           59863 __mmap64

mmwork 17483/17483     666888 
\tffffffff815b8430 lru_add_drain_cpu+0x20
\tffffffff815b8988 lru_add_drain
\tffffffff815f3742 populate_vma_page_range
\tffffffff82259cc1 do_syscall_64
\t           59863 __mmap64
"""

TRACE = """\
          mmwork-17503   [001] d..2.  4177.201029: contention_begin: 000000000abe5191 (flags=SPIN)
          mmwork-17504   [000] d..1.  4177.201030: contention_begin: 000000000abe5191 (flags=SPIN)
          mmwork-17503   [001] d..2.  4177.201064: contention_end: 000000000abe5191 (ret=0)
          mmwork-17504   [000] d..1.  4177.201080: contention_end: 000000000abe5191 (ret=0)
          mmwork-17504   [000] d..1.  4177.201100: contention_begin: 00000000fc8582b0 (flags=SPIN)
          mmwork-17504   [000] d..1.  4177.201101: contention_end: 00000000fc8582b0 (ret=0)
"""

STACKS = """\
          mmwork-17503   [001] d..2.  4177.201029: contention_begin: 000000000abe5191 (flags=SPIN)
          mmwork-17503   [001] d..2.  4177.201063: <stack trace>
 => trace_event_raw_event_contention_begin
 => __pv_queued_spin_lock_slowpath
 => _raw_spin_lock_irqsave
 => folio_lruvec_lock_irqsave
 => folio_batch_move_lru
 => lru_add_drain_cpu
 => lru_add_drain
          mmwork-17504   [000] d..1.  4177.201066: contention_begin: 000000000abe5191 (flags=SPIN)
          mmwork-17504   [000] d..1.  4177.201067: <stack trace>
 => trace_event_raw_event_contention_begin
 => __pv_queued_spin_lock_slowpath
 => _raw_spin_lock_irqsave
 => folio_lruvec_lock_irqsave+0x5a/0x90
 => __page_cache_release.part.0
 => folios_put_refs
"""


def test_perf_script_folds_root_first_weighted_by_period():
    folded = stacks.fold(PERF_SCRIPT)
    key = "__mmap64;do_syscall_64;populate_vma_page_range;lru_add_drain;lru_add_drain_cpu"
    assert folded[key] == 333444 + 666888          # offsets stripped, same stack merged
    assert folded["__munmap;do_syscall_64;__x64_sys_munmap;unmap_page_range"] == 333444
    assert stacks.from_text(stacks.to_text(folded)) == folded


def test_top_functions_and_focus():
    top = {f.function: f for f in stacks.top_functions(stacks.fold(PERF_SCRIPT))}
    assert top["do_syscall_64"].inclusive == 1.0
    assert top["lru_add_drain_cpu"].self_share == pytest.approx(0.75)
    only = stacks.focus(stacks.fold(PERF_SCRIPT), "__x64_sys_munmap")
    assert list(only) == ["__munmap;do_syscall_64;__x64_sys_munmap;unmap_page_range"]


def test_diff_ranks_what_carries_the_change_per_unit_of_work():
    base = Counter({"a;b": 100, "a;c": 100})      # 200 ns over 2 pages: 100 ns/page
    arm = Counter({"a;b": 100, "a;c": 400})       # 500 ns over 2 pages: 250 ns/page
    d = stacks.diff(arm, 2, base, 2)
    by = {x.function: x for x in d}
    assert by["c"].change == 150 and by["c"].share_of_change == 1.0
    assert by["b"].change == 0
    assert d[0].function in ("a", "c")            # largest changes first
    assert stacks.diff(arm, 4, arm, 2)[0].change == pytest.approx(-125)   # per unit, not raw


def test_lock_waits_are_paired_per_task_and_lock():
    waits = {w.lock: w for w in locks.pair_waits(TRACE)}
    lru = waits["000000000abe5191"]
    assert lru.count == 2
    assert lru.total_us == pytest.approx(35 + 50, abs=0.01)
    assert lru.max_us == pytest.approx(50, abs=0.01)
    assert waits["00000000fc8582b0"].count == 1


def test_callers_skip_the_lock_machinery():
    callers = locks.callers_from_stacks(STACKS)
    assert callers == Counter({
        "folio_lruvec_lock_irqsave <- folio_batch_move_lru <- lru_add_drain_cpu": 1,
        "folio_lruvec_lock_irqsave <- __page_cache_release.part.0 <- folios_put_refs": 1})
    c = locks.Contention(waits=locks.pair_waits(TRACE), callers=callers)
    shares = {x.caller: x.wait_us for x in c.caller_waits()}
    assert sum(shares.values()) == pytest.approx(sum(w.total_us for w in c.waits))
    assert locks.Contention.model_validate(c.model_dump()) == c     # stored and read back


ATTRIBUTE = """\
name = "attribute"
workload = "populate-unmap"
repetitions = 3
metrics = ["populate_ns_per_page"]
baseline = { workers = 1 }
[params]
seconds = 0.3
[matrix]
workers = [1, 2]
"""


def _has_lock_events() -> bool:
    """Whether this kernel has lock:contention_begin (tracefs mounted for the look)."""
    journal = knobs.Journal()
    with journal.session():
        tf = knobs.Tracefs().mount(journal)
        return tf is not None and (tf / "events/lock/contention_begin").is_dir()


@pytest.mark.skipif(not is_root(), reason="needs root (mmlab mounts tracefs itself)")
def test_attribute_then_explain_shows_the_populate_and_unmap_paths(tmp_path):
    run, results = run_profile(tmp_path, ATTRIBUTE, "--attribute")
    assert run.returncode == 0, run.stderr
    assert "attribution stored for 2 arm(s)" in run.stdout
    out = json.loads(mmlab("explain", "1", "--results", str(results), "--json").stdout)
    arm2 = next(a for a in out["arms"] if a["arm"] == "workers=2")
    assert out["pairs"][0]["arm"] == "workers=2" and out["pairs"][0]["deltas"]
    # The whole profile's top dozen by inclusive share is mostly frames every
    # call has (entry, libc's wrappers, both syscalls); beside a busy
    # neighbour the populate frames fell just below them once.  Its mmap
    # call alone, as a user looks at one phase, leads with them.
    mmap = json.loads(mmlab("explain", "1", "--results", str(results), "--json",
                            "--focus", "vm_mmap_pgoff").stdout)
    top = {f["function"] for a in mmap["arms"] for f in a["top"]}
    assert "populate_vma_page_range" in top or "__mm_populate" in top, top
    # The two workers contend only while both run at once: beside neighbours
    # that starve them they may never overlap, and then no mm lock is
    # contended at all.  Whenever one on their page paths was, it is the
    # lruvec lock.  (Beside a busy neighbour the scheduler's own locks show
    # up too: __schedule's and try_to_wake_up's, from the tasks' switches.)
    mm = [c for c in arm2["callers"] if re.search(r"lru|folio|page|zap|populate|unmap",
                                                   c["caller"])]
    if _has_lock_events() and mm:
        assert any("folio_lruvec_lock" in c["caller"] for c in mm), arm2["callers"]
    nothing = mmlab("explain", "2", "--results", str(results))
    assert nothing.returncode == 2 and "no experiment 2" in nothing.stderr


def test_flame_graphs_are_wellformed_svg_with_every_visible_frame(tmp_path):
    import xml.etree.ElementTree as ET

    from mmlab.report import flamegraph
    folded = stacks.fold(PERF_SCRIPT)
    svg = flamegraph.render(folded, "t <&>")
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    titles = [t.text for t in root.iter(f"{ns}title")]
    assert any(t.startswith("lru_add_drain_cpu (75.00%)") for t in titles)
    assert any(t.startswith("all (100.00%)") for t in titles)
    widths = {t.text.split(" ")[0]: float(g.find(f"{ns}rect").get("width"))
              for g in root.iter(f"{ns}g") for t in g.findall(f"{ns}title")}
    assert widths["all"] == pytest.approx(flamegraph.WIDTH)
    assert widths["__mmap64"] == pytest.approx(0.75 * flamegraph.WIDTH)
    grown = Counter({"a;b": 100, "a;c": 400})
    diff = ET.fromstring(flamegraph.differential(grown, 2, Counter({"a;b": 100, "a;c": 100}), 2,
                                                 "d"))
    fills = {g.find(f"{ns}title").text.split(" ")[0]: g.find(f"{ns}rect").get("fill")
             for g in diff.iter(f"{ns}g")}
    assert fills["c"] == "rgb(255,0,0)" and fills["b"] == "rgb(255,255,255)"


def test_tracepoint_events_are_counted_by_system_and_name():
    from mmlab.attribution import events
    trace = """\
# tracer: nop
          mmwork-17503   [001] ..... 4177.201029: mmap_lock_start_locking: mm=0000 memcg_path= write=true
          mmwork-17503   [001] ..... 4177.201030: mmap_lock_acquire_returned: mm=0000 write=true success=true
          mmwork-17504   [000] ..... 4177.201031: mmap_lock_start_locking: mm=0001 memcg_path= write=false
     kcompactd0-41     [000] ..... 4177.201032: mm_compaction_begin: zone_start=0x1
"""
    got = events.count(trace, {"mmap_lock_start_locking": "mmap_lock",
                               "mmap_lock_acquire_returned": "mmap_lock",
                               "mm_compaction_begin": "compaction"})
    assert got == Counter({"mmap_lock:mmap_lock_start_locking": 2,
                           "mmap_lock:mmap_lock_acquire_returned": 1,
                           "compaction:mm_compaction_begin": 1})


def test_a_tracefs_session_records_this_process_tree_only_and_puts_the_filter_back(tmp_path):
    """Inside a session the pid filter is this process, followed into the
    processes it starts (a neighbour's lock waits are not the trial's);
    afterwards every file holds what it held before."""
    import os

    from mmlab.attribution import tracefs
    (tmp_path / "options").mkdir()
    files = {"tracing_on": "1\n", "buffer_size_kb": "1408\n", "options/stacktrace": "0\n",
             "options/event-fork": "0\n", "set_event_pid": "\n", "trace": "",
             "ev": "0\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with tracefs.session(tmp_path, ["ev"]):
        assert (tmp_path / "set_event_pid").read_text() == str(os.getpid())
        assert (tmp_path / "options/event-fork").read_text() == "1"
    assert (tmp_path / "set_event_pid").read_text() == ""
    assert (tmp_path / "options/event-fork").read_text() == "0"
    assert (tmp_path / "tracing_on").read_text() == "1"
