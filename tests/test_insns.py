"""Instructions per page: mmwork's window markers and counters, the QEMU
plugin built from Debian's qemu source and counting a real guest, the
counting pass joined into the timing samples, the metric absent (never zero)
where no source exists, and verdicts and narrow on an instruction metric."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from mmlab import workloads
from mmlab.attribution import explain, functions
from mmlab.errors import MmlabError
from mmlab.experiment.plan import parse
from mmlab.judge import verdicts
from mmlab.judge.states import STATE_FUNCTIONS
from mmlab.kernels import images, qemu_plugin
from mmlab.machine.knobs import HostSettings
from mmlab.names import safe_name
from mmlab.run import driver, narrow, runner
from mmlab.store import Store
from mmlab.targets import TargetPool, TrialError, boot, qemu
from mmlab.targets.host import HostTarget
from mmlab.workloads import insns
from mmlab.workloads.build import mmwork_path
from mmlab.workloads.samples import Sample

from .conftest import mmlab, samples_of
from .fake_target import RUSAGE, FakeTarget, fake_pool

needs_qemu = pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                                reason="QEMU is not installed (make setup installs it)")
SMALL = {"rounds": 3, "min-ms": 0, "thp": "nohugepage"}
PO = "pageout-refault"
ADVISE = "advise_kernel_insns_per_page"


def pageout() -> workloads.Workload:
    return workloads.get(PO)


# ---------------------------------------------------------------- mmwork's side

def test_every_timed_window_declares_its_instruction_metrics():
    for wl in workloads.registry().values():
        for w in wl.windows:
            for name in (w.kernel_metric, w.user_metric):
                m = wl.metric(name)
                assert m.unit == "insns" and m.direction == "lower" and w.unit in name
    assert {w.name for w in pageout().windows} == {"prefault", "advise", "post_touch"}


def test_the_markers_are_the_nops_the_plugin_matches():
    """0f 1f 80 + a displacement 0x4d4d<kind><window>: begin and end of
    each pageout window, and the sample and warm-up ends."""
    dump = subprocess.run(["objdump", "-d", str(mmwork_path())], capture_output=True,
                          text=True).stdout
    found = {int(line.split("nopl")[1].split("(")[0], 16) for line in dump.splitlines()
             if "0f 1f 80" in line and "nopl   0x4d4d" in line}
    assert {0x4d4d0100, 0x4d4d0200, 0x4d4d0101, 0x4d4d0201, 0x4d4d0102, 0x4d4d0202,
            0x4d4d0300, 0x4d4d0400} <= found


def test_insns_counts_windows_and_labels_the_source():
    """--insns: each sample says how many windows ran and the units of one;
    the metrics exist only where perf counts (absent here without a PMU)."""
    (s,) = samples_of(PO, "--mapping-kb", "1024", "--rounds", "3", "--min-ms", "0", "--insns")
    assert s["counts"]["advise_windows"] == s["counts"]["rounds"] == 3
    assert s["counts"]["advise_units"] == 256
    have_perf, why = insns.perf_status()
    if have_perf:
        assert s["state"]["insns_source"] == "perf" and s["metrics"][ADVISE] > 0
    else:
        assert ADVISE not in s["metrics"] and "perf_event_open" in s["state"]["insns_source"]
        assert "perf_event_open" in why
    (plain,) = samples_of(PO, "--mapping-kb", "1024", "--rounds", "3", "--min-ms", "0")
    assert "advise_windows" not in plain["counts"] and "insns_source" not in plain["state"]


# ---------------------------------------------------------------- joining the passes

def sample(metrics=None, counts=None, state=None) -> Sample:
    return Sample(workload=PO, sample=0, mmwork_version="t", params={}, metrics=metrics or {},
                  counts=counts or {}, rusage=RUSAGE, vmstat_delta={}, state=state or {},
                  errors={})


def record(kind: str, advise: tuple[int, int, int]) -> str:
    windows = [[0, 0, 0], list(advise)] + [[0, 0, 0]] * 6
    return json.dumps({"kind": kind, "record": 0, "unmatched": 1, "windows": windows})


def test_plugin_records_become_per_unit_metrics_of_the_counted_samples():
    counted = [sample(counts={"advise_units": 100.0, "advise_windows": 4.0})]
    out = "\n".join([json.dumps({"kind": "start"}), record("warmup", (9, 9, 9)),
                     record("sample", (4, 4000, 80)), json.dumps({"kind": "exit"})])
    insns.from_plugin(pageout(), counted, out)
    assert counted[0].metrics == {ADVISE: 10.0, "advise_user_insns_per_page": 0.2}
    assert counted[0].counts["insns_windows_unmatched"] == 1
    with pytest.raises(insns.Unavailable, match="closed 0 samples, mmwork printed 1"):
        insns.from_plugin(pageout(), counted, record("warmup", (1, 1, 1)))


def test_the_counting_pass_joins_the_timing_samples_by_index():
    timed = [sample({"advise_ns_per_page": 5.0}), sample({"advise_ns_per_page": 6.0})]
    counted = [sample({"advise_ns_per_page": 99.0, ADVISE: float(i)}, {"advise_units": 1.0},
                      {"insns_source": "qemu tcg plugin"}) for i in (1, 2)]
    insns.add_counts(timed, pageout(), lambda: counted)
    assert [s.metrics for s in timed] == [{"advise_ns_per_page": 5.0, ADVISE: 1.0},
                                          {"advise_ns_per_page": 6.0, ADVISE: 2.0}]
    assert timed[0].state["insns_source"] == "qemu tcg plugin, separate counting pass"

    def unavailable():
        raise insns.Unavailable("no plugin here")
    bare = [sample({"advise_ns_per_page": 5.0})]
    insns.add_counts(bare, pageout(), unavailable)
    assert ADVISE not in bare[0].metrics and bare[0].state["insns_source"] == "none (no plugin here)"


def test_a_host_trial_counts_where_perf_does():
    """A profile naming an instruction metric gets a counting pass on the
    host: perf's counts where the CPU has them, else the reason, no metric.
    (A host without a counter refuses such a profile at plan; its plan,
    made where one counts, can still reach it: a resumed or a fleet's.)"""
    text = (PROFILE.replace('kernel = ["debian:6.12", "debian:6.19"]', 'kernel = ["host"]')
            .replace('baseline = { kernel = "debian:6.12" }', 'baseline = { kernel = "host" }')
            .replace("mapping-kb = 1024", "mapping-kb = 1024\nrounds = 2\nmin-ms = 0")
            .replace(f'metrics = ["{ADVISE}"]', 'metrics = ["advise_ns_per_page"]'))

    def measuring(*metrics: str):
        timed = parse(text)
        return timed.model_copy(update={"profile": timed.profile.model_copy(
            update={"metrics": list(metrics)})})
    plan = measuring(ADVISE, "advise_ns_per_page")
    (s,) = HostTarget().run_trial(plan.arms[0], plan).samples
    ok, why = insns.perf_status()
    if ok:
        assert s.metrics[ADVISE] > 0
        assert s.state["insns_source"] == "perf, separate counting pass"
    else:
        assert ADVISE not in s.metrics and s.state["insns_source"] == f"none ({why})"
    assert s.metrics["advise_ns_per_page"] > 0 and s.params["insns"] is False  # timed plain
    counts_only = measuring(ADVISE)     # counts and nothing else: the counting pass alone
    if ok:
        (c,) = HostTarget().run_trial(counts_only.arms[0], counts_only).samples
        assert c.params["insns"] is True and set(c.metrics) <= pageout().window_metrics()
        assert c.state["insns_source"] == "perf, counting pass alone"
    else:
        with pytest.raises(TrialError, match=re.escape(why)):
            HostTarget().run_trial(counts_only.arms[0], counts_only)


# ---------------------------------------------------------------- verdicts and narrow

PROFILE = f"""
name = "insns-verdict"
workload = "{PO}"
repetitions = 5
metrics = ["{ADVISE}"]
tolerance = 0.01
baseline = {{ kernel = "debian:6.12" }}
[params]
mapping-kb = 1024
[matrix]
kernel = ["debian:6.12", "debian:6.19"]
"""


def test_an_instruction_metric_is_judged_like_any_other(tmp_path):
    """Counts with 0.1 % noise, 3 % apart, a 1 % tolerance: decided in 5 rounds."""
    plan = parse(PROFILE)
    store = Store(tmp_path / "r")
    exp = store.create_experiment(plan)
    lab = fake_pool(FakeTarget({"kernel=debian:6.19": 1.03}, cv=0.001))
    runner.run(store, exp, plan, lab, with_controls=False)
    (c,) = verdicts.judge(plan, store.measurements(exp)).comparisons
    assert c.metric == ADVISE and c.verdict == "regression" and c.rounds == 5


def test_narrow_measures_the_metric_it_narrows_on(tmp_path):
    text = PROFILE.replace(f'metrics = ["{ADVISE}"]', 'metrics = ["advise_ns_per_page"]')
    plan = parse(text)
    store = Store(tmp_path / "r")
    lab = fake_pool(FakeTarget({"kernel=debian:6.19": 1.03}, cv=0.001))
    c = narrow.experiment_step(store, plan, "debian:6.12", "debian:6.19", ADVISE,
                               driver.Here(lab))
    assert c.metric == ADVISE and c.verdict == "regression"
    assert ADVISE in store.plan(1).profile.metrics
    assert insns.wanted(plan.workload, store.plan(1).profile.metrics)


# ---------------------------------------------------------------- the plugin in a guest

@pytest.fixture(scope="module")
def plugin() -> Path:
    """Built from the cached header (the first fetch of Debian's qemu source
    takes a minute; then it is cached by version)."""
    return qemu_plugin.ensure()


def test_the_plugin_is_built_against_the_installed_qemu(plugin):
    syms = subprocess.run(["nm", "-D", "--defined-only", str(plugin)], capture_output=True,
                          text=True).stdout
    assert "qemu_plugin_install" in syms and "qemu_plugin_version" in syms
    assert plugin.parent.name == safe_name(qemu_plugin.source_version())
    assert qemu_plugin.ensure() == plugin and qemu_plugin.status()[0]


def test_the_probe_says_which_source_counts(plugin):
    facts = {f["what"]: f for f in json.loads(mmlab("probe", "--json").stdout)}
    host = facts["instruction counts (host)"]
    assert host["ok"] == insns.perf_status()[0] == facts["hardware counters"]["ok"]
    assert facts["instruction counts (TCG guests)"]["ok"] and str(plugin) in \
        facts["instruction counts (TCG guests)"]["value"]


def counted_boot(kernel, plugin, mapping_kb: int) -> list[Sample]:
    return qemu.sample(boot.Guest(kernel, memory_mb=512), pageout(),
                       insns.counting_params({**SMALL, "mapping-kb": mapping_kb}), samples=1,
                       warmups=0, settings=HostSettings(), plugin=plugin)


@needs_qemu
def test_a_guest_counts_stable_positive_and_growing_with_the_mapping(plugin):
    """Three boots: 2 MiB twice (within 1 %), then 8 MiB (more per window)."""
    k = images.ensure("debian:6.12")
    (a,), (b,), (big,) = (counted_boot(k, plugin, kb) for kb in (2048, 2048, 8192))
    for s in (a, b, big):
        assert s.state["insns_source"] == "qemu tcg plugin"
        assert s.metrics[ADVISE] > 100 and s.metrics["prefault_user_insns_per_page"] > 0
        assert s.counts["insns_windows_unmatched"] == 0
    # One guest state per boot: over the 21 point releases of 6.12 a cell's
    # count never moved more than 1%, and two boots of one kernel agree closer
    assert math.isclose(a.metrics[ADVISE], b.metrics[ADVISE], rel_tol=0.01)

    def per_window(s: Sample) -> float:
        return s.metrics[ADVISE] * s.counts["advise_units"]
    assert per_window(big) > 3 * per_window(a)


@needs_qemu
def test_mmlab_run_insns_counts_in_a_counting_pass(plugin, tmp_path):
    """`mmlab run --insns` counts as experiments do: the timing boot runs
    without the plugin, a second boot counts, joined by sample."""
    proc = mmlab("run", PO, "--kernel", "debian:6.12", "--insns", "--samples", "1", "--json",
                 "--mapping-kb", "1024", "--rounds", "2", "--min-ms", "0",
                 "--results", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    (s,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert s["metrics"][ADVISE] > 0
    assert s["state"]["insns_source"].startswith("qemu tcg plugin")


@needs_qemu
def test_a_timed_and_counted_plan_runs_counting_boots_two_at_a_time(plugin, tmp_path,
                                                                     monkeypatch):
    """Four trials in TCG guests: each timing boot alone, nothing of mmlab's
    beside it; the counting boots of two trials together; every sample has
    its time and its count.  Then two kernels' instructions by function,
    counted at once."""
    spans: list[tuple[bool, float, float]] = []       # (counting, start, end)
    restore = qemu.snapshot.restore

    def timed_restore(guest, snap, script, accel, swap, plugin=None, plugin_extra=()):
        t0 = time.monotonic()
        try:
            return restore(guest, snap, script, accel, swap, plugin, plugin_extra)
        finally:
            spans.append((plugin is not None, t0, time.monotonic()))
    monkeypatch.setattr(qemu.snapshot, "restore", timed_restore)
    text = (PROFILE.replace('kernel = ["debian:6.12", "debian:6.19"]', 'kernel = ["debian:6.12"]')
            .replace("repetitions = 5", "repetitions = 4\nwarmups = 0")
            .replace(f'metrics = ["{ADVISE}"]', f'metrics = ["{ADVISE}", "advise_ns_per_page"]')
            .replace("mapping-kb = 1024", "mapping-kb = 1024\nrounds = 2\nmin-ms = 0"))
    plan = parse(text)
    store = Store(tmp_path / "r")
    exp = store.create_experiment(plan)
    pool = TargetPool(say=lambda _: None)
    assert pool.counting_side_by_side(plan, store.trials(exp)) == 2
    result = runner.run(store, exp, plan, pool, with_controls=False)
    assert (result.done, result.failed) == (4, 0)
    for s in (s for got in store.samples_by_arm(exp).values() for s in got):
        assert s.metrics["advise_ns_per_page"] > 0 and s.metrics[ADVISE] > 100
    timing = [(a, b) for c, a, b in spans if not c]
    counting = sorted((a, b) for c, a, b in spans if c)
    assert len(timing) == 4 and len(counting) == 4

    def overlap(x: tuple[float, float], y: tuple[float, float]) -> bool:
        return x[0] < y[1] and y[0] < x[1]
    assert not any(overlap(t, o) for t in timing for o in timing + counting if o is not t)
    assert overlap(counting[0], counting[1]) and overlap(counting[2], counting[3])

    # Instructions by function alone: both kernels' counted at once.
    spans.clear()
    count_functions = qemu.count_functions

    def timed_count(*args, **kw):
        t0 = time.monotonic()
        try:
            return count_functions(*args, **kw)
        finally:
            by_function.append((t0, time.monotonic()))
    by_function: list[tuple[float, float]] = []
    monkeypatch.setattr(qemu, "count_functions", timed_count)
    two = parse(text.replace('kernel = ["debian:6.12"]', 'kernel = ["debian:6.12", "debian:6.19"]')
                .replace("warmups = 0", 'warmups = 0\nattribution = ["functions", '
                                                 '"state_functions"]'))
    exp = store.create_experiment(two)
    assert pool.attribution_side_by_side(two) == 2
    assert runner.attribute(store, exp, two, pool) == 2
    # Each arm's trials start from two saved boots (4 rounds), and the
    # profile asks for each boot's counts by function, for the states audit.
    n = qemu.snapshot.states(two)
    assert n == 2
    assert {a: set(k) for a, k in store.attributions(exp).items()} == {
        a.name: {"functions", STATE_FUNCTIONS} for a in two.arms}
    assert len(by_function) == 2 * n and overlap(*sorted(by_function)[:2])


@needs_qemu
def test_without_a_plugin_the_trial_runs_and_the_metric_is_absent(tmp_path, monkeypatch):
    """No cached header and no reachable mirror: the timing pass still runs,
    its samples say why they carry no counts."""
    real = images.ensure("debian:6.12")
    cache = tmp_path / "kernels"
    cache.mkdir()
    os.symlink(real.dir, cache / Path(real.dir).name)
    monkeypatch.setenv("MMLAB_KERNEL_CACHE", str(cache))
    monkeypatch.setenv("MMLAB_APT_MIRROR", "http://127.0.0.1:9/debian")
    text = (PROFILE.replace('kernel = ["debian:6.12", "debian:6.19"]', 'kernel = ["debian:6.12"]')
            .replace("repetitions = 5", "repetitions = 3\nwarmups = 0")
            .replace("mapping-kb = 1024", "mapping-kb = 1024\nrounds = 2\nmin-ms = 0"))
    plan = parse(text.replace(f'metrics = ["{ADVISE}"]',
                              f'metrics = ["{ADVISE}", "advise_ns_per_page"]'))
    target = qemu.QemuTarget("debian:6.12", say=lambda _: None)
    result = target.run_trial(plan.arms[0], plan)
    (s,) = result.samples
    assert s.metrics["advise_ns_per_page"] > 0 and ADVISE not in s.metrics
    assert s.state["insns_source"].startswith("none (no QEMU plugin: ")
    assert "cannot be reached" in s.state["insns_source"]
    counts_only = parse(text)           # nothing to measure without counts: the trial fails
    with pytest.raises(TrialError, match="no QEMU plugin: .*cannot be reached"):
        target.run_trial(counts_only.arms[0], counts_only)


# ---------------------------------------------------------------- instructions by function

def symbols_file(tmp_path: Path) -> Path:
    """A System.map-format table: _text at a link address, two functions, _etext."""
    text = "\n".join(["ffffffff81000000 T _text", "ffffffff81000100 t shrink_folio_list",
                      "ffffffff81000200 T folio_referenced", "ffffffff81000300 D some_data",
                      "ffffffff81000400 T _etext", ""])
    path = tmp_path / "symbols.gz"
    path.write_bytes(gzip.compress(text.encode()))
    return path


def plugin_output(text: int, blocks: list[tuple[int, int]], advise_total: int) -> str:
    return "\n".join([record("sample", (2, advise_total, 10)).replace('"unmatched": 1',
                                                                      '"unmatched": 0'),
                      json.dumps({"kind": "blocks", "window": 1, "dropped": 0,
                                  "blocks": [[text + off, n] for off, n in blocks]})])


def test_blocks_are_named_by_function_at_the_boots_kaslr_offset(tmp_path):
    """Run-time addresses minus this boot's _text, against the table's own
    _text: each block lands in its function; past _etext it is unresolved;
    the functions and the unresolved part are the window's kernel total."""
    text = 0xffffffff9a000000
    counted = [sample(counts={"advise_units": 10.0})]
    out = plugin_output(text, [(0x110, 600), (0x1f0, 200), (0x210, 100), (0x500, 100)], 1000)
    found = functions.attribute(pageout(), counted, out, f"{text:x} T _text\n",
                                symbols_file(tmp_path), "6.12-test")
    assert found.windows["advise"] == {"shrink_folio_list": 40.0, "folio_referenced": 5.0}
    assert found.unresolved["advise"] == 5.0 and found.kernel["advise"] == 50.0
    assert found.top("advise", 1) == [("shrink_folio_list", 40.0)]
    with pytest.raises(MmlabError, match="add up to 900 of the plugin's 1000"):
        functions.attribute(pageout(), counted, plugin_output(text, [(0x110, 900)], 1000),
                            f"{text:x} T _text\n", symbols_file(tmp_path), "6.12-test")
    with pytest.raises(MmlabError, match="no _text address"):
        functions.attribute(pageout(), counted, out, "", symbols_file(tmp_path), "6.12-test")


def test_a_pair_shows_the_functions_whose_instructions_moved_most():
    def counted(per_fn: dict[str, float]) -> functions.FunctionInsns:
        return functions.FunctionInsns(windows={"walk": per_fn}, kernel={"walk": sum(per_fn.values())},
                                       unresolved={"walk": 0.0}, units={"walk": "migrated_page"},
                                       kernel_release="x", text_address=0)
    a = counted({"rmap_walk_ksm": 50.0, "anon_vma_interval_tree_iter_next": 10.0})
    base = counted({"rmap_walk_ksm": 60.0, "anon_vma_interval_tree_iter_next": 9000.0,
                    "anon_vma_interval_tree_iter_first": 5.0})
    (w,) = explain.explain_functions("B", a, "A", base, n=2)
    assert w.baseline == "A" and w.change == 60.0 - 9065.0
    assert [r.function for r in w.rows] == ["anon_vma_interval_tree_iter_next", "rmap_walk_ksm"]
    (alone,) = explain.explain_functions("A", base, n=1)
    assert alone.baseline is None and alone.rows[0].function == "anon_vma_interval_tree_iter_next"


@needs_qemu
def test_a_guest_counts_its_kernel_instructions_by_function(plugin, tmp_path):
    """One boot reads the kernel's kallsyms (kept from then on), one counts
    by block with two vCPUs (per-vCPU callbacks, windows that may migrate):
    every window's functions add up to its total, which is the one-vCPU
    counting pass's own figure, and MADV_PAGEOUT's largest functions are
    reclaim and rmap ones."""
    real = images.ensure("debian:6.12")
    copy = shutil.copytree(real.dir, tmp_path / "k", ignore=shutil.ignore_patterns("symbols.gz"))
    k = dataclasses.replace(real, dir=str(copy))
    guest = boot.Guest(k, vcpus=2, memory_mb=512)
    params = {**SMALL, "mapping-kb": 2048}
    found = qemu.count_functions(guest, pageout(), params, 1, 0, HostSettings(), plugin)
    assert k.symbols.exists()
    (plain,) = counted_boot(k, plugin, 2048)
    # Two boots, of two and of one vCPU, are two guest states: one-vCPU
    # boots agree within 1% (the test above), and the second vCPU moved the
    # count by 1.04% once (TLB-flush IPIs, per-CPU LRU batches), so 1% failed
    # on a fresh clone; beside stress-ng and a tracker run (load 8) it moved
    # 3.96%, the other vCPU's share following the host's pace.  8% holds
    # those states; that the blocks add up to the window's own total,
    # exactly, is checked below.
    assert math.isclose(found.kernel["advise"], plain.metrics[ADVISE], rel_tol=0.08)
    advise = dict(found.top("advise", 12))
    assert {"shrink_folio_list", "try_to_unmap_one", "page_vma_mapped_walk"} & advise.keys()
    assert sum(found.windows["advise"].values()) + found.unresolved["advise"] == \
        pytest.approx(found.kernel["advise"])
    assert "clear_page" in found.top("prefault", 1)[0][0]


@needs_qemu
def test_mmlab_run_functions_prints_a_kernels_top_functions(plugin, tmp_path):
    """`run --functions` in a two-node guest: the move_pages walk by function;
    a workload whose window did no work is a one-line error."""
    results = str(tmp_path / "r")
    proc = mmlab("run", "ksm-rmap", "--kernel", "debian:6.12", "--numa-nodes", "2",
                 "--samples", "1", "--vmas", "100", "--trigger", "move", "--no-writer",
                 "--functions", "25", "--results", results)
    assert proc.returncode == 0, proc.stderr
    assert "kernel instructions in 'walk' by function" in proc.stdout
    assert "rmap_walk_ksm" in proc.stdout
    # With --no-probes the walk cannot tell how many pages it moved: its
    # window has no units of work to count per (compaction's reach varies).
    idle = mmlab("run", "ksm-rmap", "--kernel", "debian:6.12", "--samples", "1", "--vmas", "50",
                 "--no-probes", "--functions", "3", "--results", results)
    assert idle.returncode != 0
    assert idle.stderr.strip().splitlines()[-1] == (
        "mmlab: --functions: no timed window of ksm-rmap did any work here (windows: walk)")


# ---------------------------------------------------------------- a user's own program

MPROTECT = Path(__file__).parent.parent / "experiments" / "repro" / "mprotect_repro.c"


def marked_program(pages: int = 2048) -> workloads.Workload:
    """The mprotect reproducer, its loop marked as window 1 with mmlab.h."""
    from mmlab.workloads import execwork
    return execwork.build(["{source}", str(pages)], source=str(MPROTECT),
                          metrics_from="key=value", per="pages",
                          windows={"protect": execwork.ExecWindow(id=1, per="pages")})


def counted_exec(k, plugin, wl, vcpus: int = 1, samples: int = 4) -> list[Sample]:
    guest = boot.Guest(k, vcpus=vcpus, memory_mb=512)
    return qemu.sample(guest, wl, insns.counting_params({}), samples, 1, HostSettings(),
                       plugin=plugin)


@needs_qemu
def test_a_users_program_is_counted_whole_and_by_its_marked_window(plugin, k612):
    """The whole command (exec to exit, every process) and the window the
    program marks are counted per page it printed, steady to within 5% over
    four runs after a warm-up (under 1% on a quiet host; the timer ticks
    that land in a window follow the host's wall clock under TCG, and beside
    stress-ng and a tracker run, load 8, the CV reached 2.1%, failing 2%);
    a program without the header gets the whole command; with two vCPUs the
    command counts on both."""
    got = counted_exec(k612, plugin, marked_program())
    command = [s.metrics["command_kernel_insns_per_pages"] for s in got]
    protect = [s.metrics["protect_kernel_insns_per_pages"] for s in got]
    assert all(s.state["insns_source"] == "qemu tcg plugin" for s in got)
    assert 0 < max(protect) < min(command)             # the window is part of the command
    for series in (command, protect):
        assert np.std(series) / np.mean(series) < 0.05, series
    assert all(s.metrics["command_user_insns_per_pages"] > 0 for s in got)
    from mmlab.workloads import execwork
    bare = execwork.build(["sh", "-c", "head -c 4000000 /dev/zero | wc -c"])
    (s,) = counted_exec(k612, plugin, bare, samples=1)
    assert s.metrics["command_kernel_insns_per_run"] > 1e5
    assert not [m for m in s.metrics if m.startswith("protect_")]
    (two,) = counted_exec(k612, plugin, marked_program(), vcpus=2, samples=1)
    # Another guest state (a second vCPU counts its own kernel work: its
    # timer ticks, the IPIs an mprotect's TLB flush sends): the same order,
    # not the same count, is what this holds; 10% is several times the
    # one-vCPU runs' spread (2%) and far inside a count that missed a vCPU
    assert two.metrics["command_kernel_insns_per_pages"] == pytest.approx(
        float(np.median(command)), rel=0.1)


@needs_qemu
def test_stress_ngs_mremap_line_is_counted_per_bogo_op_on_two_kernels(plugin, k612, k73,
                                                                       stress_ng):
    """Seed 000's command line as it is: two instances on two vCPUs, its
    kernel instructions per bogo op from stress-ng's own YAML."""
    from mmlab.workloads import execwork
    wl = execwork.build("stress-ng --mremap 2 --mremap-bytes 4K --mremap-ops 400 "
                        "--metrics-brief -Y {out}", metrics_from="stress-ng-yaml",
                        per="bogo-ops")
    per_op = {}
    for k in (k612, k73):
        (s,) = counted_exec(k, plugin, wl, vcpus=2, samples=1)
        per_op[k.name] = s.metrics["command_kernel_insns_per_bogo_ops"]
        assert s.counts["command_units"] >= 400
    assert all(v > 1000 for v in per_op.values()), per_op


@needs_qemu
def test_a_users_program_is_counted_by_kernel_function(plugin, k612):
    """--functions on an exec workload: both windows by function, the
    marked one led by mprotect's own path (one vCPU: a per-vCPU window
    whose thread moved to the other vCPU is dropped); with two vCPUs the
    whole command's blocks add up to its total within the plugin's slack."""
    one = boot.Guest(k612, vcpus=1, memory_mb=512)
    found = qemu.count_functions(one, marked_program(), {}, 1, 0, HostSettings(), plugin)
    assert set(found.windows) == {"command", "protect"}
    protect = dict(found.top("protect", 12))
    assert {"change_protection", "mprotect_fixup", "do_mprotect_pkey"} & protect.keys(), protect
    two = boot.Guest(k612, vcpus=2, memory_mb=512)
    found = qemu.count_functions(two, marked_program(), {}, 1, 0, HostSettings(), plugin)
    assert sum(found.windows["command"].values()) + found.unresolved["command"] == \
        pytest.approx(found.kernel["command"], rel=functions.OVER_VCPUS)
