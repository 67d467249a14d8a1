"""Events beyond instructions (the QEMU plugin's events=on): the metric
family's names and refusals, the plugin's records, and guests counting
programs whose events are known: N locked adds and N `rep stosb` of B
bytes (exact, user side), and a 2-vCPU guest whose mprotect calls must
shoot down the other vCPU's TLB (IPIs and invalidations, kernel side)."""

from __future__ import annotations

import json
import shutil

import pytest

from mmlab import workloads
from mmlab.errors import MmlabError
from mmlab.experiment.plan import parse
from mmlab.kernels import qemu_plugin
from mmlab.machine.knobs import HostSettings
from mmlab.store import Store
from mmlab.targets import boot, qemu, stays
from mmlab.targets.boot import initramfs_cache
from mmlab.workloads import execwork, insns
from mmlab.workloads.samples import Sample

from .conftest import mmlab
from .fake_target import RUSAGE

needs_qemu = pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                                reason="QEMU is not installed (make setup installs it)")


def pageout() -> workloads.Workload:
    return workloads.get("pageout-refault")


def sample(counts: dict[str, float]) -> Sample:
    return Sample(workload="exec", sample=0, mmwork_version="t", params={}, metrics={},
                  counts=counts, rusage=RUSAGE, vmstat_delta={}, state={}, errors={})


# ---------------------------------------------------------------- the metric family

def test_an_event_metric_is_a_metric_of_any_window_and_side_with_its_unit_and_help():
    wl = pageout()
    m = wl.metric("advise_kernel_ipis_per_page")
    assert (m.unit, m.direction) == ("events", "lower") and "IPIs sent" in m.help
    assert "kernel" in m.help and "per page in the mean window advise" in m.help
    assert wl.metric("prefault_user_store_bytes_per_page").unit == "bytes"
    assert "perf's instructions" in wl.metric("advise_kernel_retired_insns_per_page").help
    assert {e for e in workloads.EVENTS} >= {"loads", "locked_insns", "invlpgs", "ipis",
                                             "string_bytes", "retired_insns"}
    asked = ["advise_kernel_locked_insns_per_page"]
    assert insns.wanted(wl, asked) and insns.only(wl, asked)
    assert insns.events_arg(wl, asked) == ("events=blocks",)     # no memory callback needed
    assert insns.events_arg(wl, [*asked, "prefault_user_store_bytes_per_page"]) == \
        ("events=on",)
    assert insns.events_arg(wl, ["advise_kernel_insns_per_page",
                                 "advise_syscall_madvise_calls"]) == ()
    exec_wl = execwork.build(["true"])
    assert exec_wl.metric("command_kernel_cr3_writes_per_run").unit == "events"


@pytest.mark.parametrize("name", ["advise_kernel_ipis_per_run", "walk_kernel_ipis_per_page",
                                  "advise_kernel_ipi_per_page", "advise_guest_ipis_per_page"])
def test_a_malformed_event_metric_is_an_unknown_metric_in_one_line(name):
    with pytest.raises(MmlabError) as err:
        pageout().metric(name)
    assert f"unknown metric '{name}'" in str(err.value) and "\n" not in str(err.value)


def test_a_host_arm_asking_for_events_is_refused_when_the_plan_is_made():
    """Only mmlab's QEMU plugin counts events: a host arm's would be
    silently absent."""
    text = ('name = "e"\nworkload = "pageout-refault"\nrepetitions = 3\nbaseline = "A"\n'
            'metrics = ["advise_kernel_ipis_per_page"]\n[[arms]]\nname = "A"\n')
    with pytest.raises(MmlabError, match=r"advise_kernel_ipis_per_page on the host .*and events"):
        parse(text)


# ---------------------------------------------------------------- the plugin's records

EVENTS = {e: [0, 0] for e in workloads.EVENTS}


def record(events: dict[str, list[int]] | None, windows: int = 2) -> str:
    r = {"kind": "sample", "record": 0, "unmatched": 0,
         "windows": [[0, 0, 0], [windows, 9000, 10]] + [[0, 0, 0]] * 6}
    if events is not None:
        r["events"] = [EVENTS] + [{**EVENTS, **events}] + [EVENTS] * 6
    return json.dumps(r)


def test_plugin_events_become_per_unit_metrics_of_the_mean_window():
    got = [sample({"advise_units": 10.0})]
    insns.from_plugin(pageout(), got, record({"ipis": [40, 0], "stores": [200, 60]}))
    m = got[0].metrics
    assert m["advise_kernel_ipis_per_page"] == 2.0          # 40 / 2 windows / 10 pages
    assert (m["advise_kernel_stores_per_page"], m["advise_user_stores_per_page"]) == (10.0, 3.0)
    assert m["advise_user_ipis_per_page"] == 0.0             # counted, and none: a zero
    assert len([k for k in m if k.startswith("advise_")]) == 2 + 2 * len(workloads.EVENTS)
    plain = [sample({"advise_units": 10.0})]                # events=off: absent, not zeros
    insns.from_plugin(pageout(), plain, record(None))
    assert set(plain[0].metrics) == {"advise_kernel_insns_per_page", "advise_user_insns_per_page"}


def test_the_counting_pass_keeps_its_event_metrics_when_joined_or_alone():
    wl = pageout()
    counted = [sample({"advise_units": 1.0})]
    counted[0].metrics = {"advise_kernel_loads_per_page": 3.0, "advise_ns_per_page": 9.0}
    timed = [sample({})]
    insns.join(timed, counted, wl)
    assert timed[0].metrics == {"advise_kernel_loads_per_page": 3.0}
    assert insns.alone(counted, wl)[0].metrics == {"advise_kernel_loads_per_page": 3.0}


# ---------------------------------------------------------------- guests

N_OPS, BYTES = 500, 3000
EXACT = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mmlab.h"

static volatile long counter;
static char buf[4096];

/* n locked adds; the loop's own instructions neither lock nor load. */
__attribute__((noinline)) static void locked_adds(long n)
{
	__asm__ __volatile__("1: lock addq $1, %0\n\tdec %1\n\tjnz 1b"
			     : "+m"(counter), "+r"(n) : : "cc");
}

/* n xchg with memory: locked without a LOCK prefix. */
__attribute__((noinline)) static void exchanges(long n)
{
	long v = 1;
	__asm__ __volatile__("1: xchg %1, %0\n\tdec %2\n\tjnz 1b"
			     : "+m"(counter), "+r"(v), "+r"(n) : : "cc");
}

/* n rep stosb of `bytes` each into a page already faulted in. */
__attribute__((noinline)) static void string_stores(long n, long bytes)
{
	__asm__ __volatile__("1: mov %1, %%rcx\n\tmov %2, %%rdi\n\trep stosb\n\tdec %0\n\tjnz 1b"
			     : "+r"(n) : "r"(bytes), "r"(buf), "a"(0)
			     : "rcx", "rdi", "memory", "cc");
}

int main(int argc, char **argv)
{
	long n = atol(argv[1]), bytes = atol(argv[2]);
	memset(buf, 1, sizeof(buf));
	MMLAB_BEGIN(1);
	locked_adds(n);
	MMLAB_END(1);
	MMLAB_BEGIN(2);
	string_stores(n, bytes);
	MMLAB_END(2);
	MMLAB_BEGIN(3);
	exchanges(n);
	MMLAB_END(3);
	printf("ops=%ld\n", n);
	return 0;
}
"""
ASKED = ["lock_user_locked_insns_per_ops", "strings_user_string_bytes_per_ops"]
EXACT_PROFILE = f"""
name = "events"
workload = "exec"
source = "exact.c"
command = ["{{source}}", "{N_OPS}", "{BYTES}"]
metrics_from = "key=value"
metrics = {json.dumps(ASKED)}
repetitions = 3
samples_per_trial = 1
warmups = 0
baseline = {{ kernel = "debian:6.12" }}
[matrix]
kernel = ["debian:6.12"]
[windows.lock]
id = 1
per = "ops"
[windows.strings]
id = 2
per = "ops"
[windows.xchg]
id = 3
per = "ops"
"""


@needs_qemu
def test_a_profile_naming_an_event_counts_locked_adds_and_rep_strings_exactly(tmp_path):
    """N locked adds: one locked instruction, one load and one store (the
    read-modify-write) per add, beside a few loads and stores at the
    window's edges (the call's return); N xchg with memory, one locked
    instruction each.  N `rep stosb` of B bytes: one
    string instruction and B string bytes and stores per op; the
    instruction count takes the rep once per byte and once more (QEMU 7.2
    enters its block again to find rcx exhausted) and the retired count
    once, so they differ by exactly B per op.  Asked for block events
    alone, the same counts come without the memory callbacks."""
    (tmp_path / "exact.c").write_text(EXACT)
    plan = parse(EXACT_PROFILE, str(tmp_path / "p.toml"))
    (s,) = qemu.QemuTarget("debian:6.12", say=lambda _: None).run_trial(plan.arms[0],
                                                                       plan).samples
    m = s.metrics
    assert m["lock_user_locked_insns_per_ops"] == 1.0, sorted(m.items())
    for event in ("loads", "stores"):
        assert 1 <= m[f"lock_user_{event}_per_ops"] < 1 + 10 / N_OPS
    assert m["lock_user_load_bytes_per_ops"] >= 8 and m["lock_user_store_bytes_per_ops"] >= 8
    assert m["lock_user_string_insns_per_ops"] == 0
    assert m["xchg_user_locked_insns_per_ops"] == 1.0          # xchg locks without the prefix
    assert m["strings_user_string_insns_per_ops"] == 1.0
    assert m["strings_user_string_bytes_per_ops"] == BYTES
    assert BYTES <= m["strings_user_stores_per_ops"] < BYTES + 10 / N_OPS
    assert m["strings_user_locked_insns_per_ops"] == 0
    per_iteration = m["strings_user_insns_per_ops"] - m["strings_user_retired_insns_per_ops"]
    assert per_iteration == BYTES
    assert m["lock_user_insns_per_ops"] == m["lock_user_retired_insns_per_ops"]  # no rep there
    # Naming block events alone, the plugin takes no memory callback
    # (events=blocks): the same retired count, and no loads, bytes or IPIs
    blocks_only = parse(EXACT_PROFILE.replace(json.dumps(ASKED),
                                              '["strings_user_retired_insns_per_ops"]'),
                        str(tmp_path / "p.toml"))
    (b,) = qemu.QemuTarget("debian:6.12", say=lambda _: None).run_trial(
        blocks_only.arms[0], blocks_only).samples
    assert b.metrics["strings_user_retired_insns_per_ops"] == \
        m["strings_user_retired_insns_per_ops"]
    assert b.metrics["lock_user_locked_insns_per_ops"] == 1.0
    assert not [k for k in b.metrics if "loads" in k or "bytes" in k or "ipis" in k]


N_CALLS = 200
SHOOTDOWN = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include "mmlab.h"

static volatile int started, stop;
static volatile char *page;

static void pin(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set))
		exit(1);
}

/* On CPU 1, reading the page: the mm stays live there, its TLB holds the page. */
static void *reader(void *arg)
{
	(void)arg;
	pin(1);
	started = 1;
	while (!stop)
		(void)page[0];
	return NULL;
}

/* Read-only and back, n times: each change must reach every CPU running the mm. */
static void protect(long n)
{
	for (long i = 0; i < n; i++) {
		mprotect((void *)page, 4096, PROT_READ);
		mprotect((void *)page, 4096, PROT_READ | PROT_WRITE);
	}
}

int main(int argc, char **argv)
{
	long n = atol(argv[1]);
	pthread_t t;
	pin(0);
	page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED)
		return 1;
	page[0] = 1;
	if (pthread_create(&t, NULL, reader, NULL))
		return 1;
	while (!started)
		;
	MMLAB_BEGIN(1);
	protect(n);
	MMLAB_END(1);
	stop = 1;
	pthread_join(t, NULL);
	MMLAB_BEGIN(2);
	protect(n);
	MMLAB_END(2);
	printf("calls=%ld\n", 2 * n);
	return 0;
}
"""


@needs_qemu
def test_a_two_vcpu_guest_counts_the_ipis_and_tlb_flushes_of_a_shootdown(tmp_path, k612):
    """mprotect of a page another thread reads on the other vCPU must flush
    that vCPU's TLB: an IPI per call, and a local invalidation, counted in
    the window and in its mprotect calls.  Once the
    thread has exited, the same calls send (almost) none.  Not exact: the
    reader may be off its vCPU for a call (an interrupt, the scheduler), a
    wakeup may send a reschedule IPI; so the counts are bounded, not
    equal.  The guest's APIC is xAPIC (QEMU 7.2's TCG has no x2APIC),
    which the IPIs counted at all confirm."""
    (tmp_path / "shootdown.c").write_text(SHOOTDOWN)
    windows = {"shared": execwork.ExecWindow(id=1, per="calls"),
               "alone": execwork.ExecWindow(id=2, per="calls")}
    wl = execwork.build(["{source}", str(N_CALLS)], source="shootdown.c", base=tmp_path,
                        metrics_from="key=value", windows=windows)
    guest = boot.Guest(k612, vcpus=2, memory_mb=512)
    (s,) = qemu.sample(guest, wl, insns.counting_params({}), 1, 0, HostSettings(),
                       plugin=qemu_plugin.ensure(),
                       plugin_extra=("events=on", *stays.plugin_args(guest, initramfs_cache())))
    m = s.metrics
    # Per syscall: the IPIs are mprotect's, and a window opened and closed
    # in user mode on its vCPU has every kernel event in a stay counted in
    # it, so the stays' events add up to the window's exactly
    assert m["shared_syscall_mprotect_kernel_ipis_per_call"] >= 0.5
    assert m["alone_syscall_mprotect_kernel_ipis_per_call"] < 0.1
    for window in ("shared", "alone"):
        for event in ("ipis", "invlpgs", "retired_insns", "stores"):
            whole = f"{window}_kernel_{event}_per_calls"
            in_stays = sum(v for k, v in m.items() if k.startswith(f"{window}_")
                           and k.endswith(f"_kernel_{event}_per_calls") and k != whole)
            assert in_stays == pytest.approx(m[whole], rel=1e-9), (window, event)
    # 0.885 and 1.0 IPIs per call in two runs here (IPIs wait for the
    # other vCPU: 20,800 kernel instructions per call, 3,400 alone)
    assert m["shared_kernel_ipis_per_calls"] >= 0.5, sorted(m.items())
    assert m["alone_kernel_ipis_per_calls"] < 0.1
    for window in ("shared", "alone"):
        flushes = sum(m[f"{window}_kernel_{e}_per_calls"] for e in ("invlpgs", "invpcids"))
        assert flushes >= 1, (window, sorted(m.items()))
        assert m[f"{window}_user_ipis_per_calls"] == 0          # user code writes no APIC
        assert m[f"{window}_kernel_locked_insns_per_calls"] > 0  # the mmap lock, at least
    # the whole command, a window over both vCPUs, holds both windows' IPIs
    assert m["command_kernel_ipis_per_run"] >= m["shared_kernel_ipis_per_calls"] * 2 * N_CALLS
    assert m["command_kernel_cr3_writes_per_run"] > 0     # exec and the switches to the program
    assert m["command_kernel_invpcids_per_run"] == 0      # QEMU 7.2's TCG CPU has no INVPCID


# ---------------------------------------------------------------- mmlab run --events

def test_mmlab_run_events_asks_for_every_event_of_every_window_and_a_guest():
    from mmlab.experiment import single
    plan = single.plan(single.Request("pageout-refault", kernel="debian:6.12",
                                      count_events=True))
    asked = plan.profile.metrics
    assert {"advise_kernel_ipis_per_page", "prefault_user_retired_insns_per_page",
            "advise_kernel_insns_per_page"} <= set(asked)            # the instructions too
    assert insns.events_arg(plan.workload, asked) == ("events=on",)
    with pytest.raises(MmlabError, match="^--events needs a guest kernel"):
        single.plan(single.Request("pageout-refault", count_events=True))


@needs_qemu
def test_mmlab_run_events_counts_a_command_in_a_guest(tmp_path):
    """`mmlab run exec --events` counts the whole command's events: a shell
    running `true` takes faults, so it stores and loads in the kernel, and
    retires fewer instructions than TCG counts (exec clears pages)."""
    proc = mmlab("run", "exec", "--kernel", "debian:6.12", "--events", "--samples", "1",
                 "--json", "--results", str(tmp_path / "r"), "--", "sh", "-c", "true")
    assert proc.returncode == 0, proc.stderr
    (s,) = [json.loads(line) for line in proc.stdout.splitlines()]
    m = s["metrics"]
    assert m["command_kernel_stores_per_run"] > 0 and m["command_kernel_string_insns_per_run"] > 0
    assert m["command_kernel_retired_insns_per_run"] < m["command_kernel_insns_per_run"]
    assert s["state"]["insns_source"].startswith("qemu tcg plugin")


# ---------------------------------------------------------------- reports

def test_every_output_with_an_event_figure_says_what_events_count(tmp_path):
    """compare and the text report (the HTML report takes the same lines):
    one line defines the events, as one defines the instructions, and an
    event's figure is the mean window's.  The fake target counts no events,
    so the figures are absent; the legend follows the profile's metrics."""
    from mmlab.report import data, fmt, text

    from .test_count_labels import counted_store
    store = Store(counted_store(tmp_path, metrics='"advise_kernel_ipis_per_page", '
                                                  '"advise_kernel_insns_per_page"'))
    d = data.gather(store, 1)
    legend = fmt.count_legend(d.workload, d.plan.profile.metrics, d.samples)
    assert legend[-1] == fmt.EVENTS_COUNTED and legend[0].startswith("insns:")
    assert fmt.EVENTS_COUNTED in " ".join(text.render(d).split())
    assert "[mean window]" in text.render(d).split("advise_kernel_ipis_per_page")[1][:20]
    proc = mmlab("compare", "1", "--results", str(tmp_path / "r"))
    assert proc.returncode == 0 and fmt.EVENTS_COUNTED in " ".join(proc.stdout.split())
    plain = Store(counted_store(tmp_path / "plain"))
    d = data.gather(plain, 1)
    assert fmt.EVENTS_COUNTED not in fmt.count_legend(d.workload, d.plan.profile.metrics,
                                                      d.samples)


def test_every_event_metric_names_its_unit_as_the_sample_contract_asks():
    """The store refuses a sample whose metric names no unit; every event's
    name carries one (it is its own, or insns, or bytes)."""
    from mmlab.workloads.samples import UNIT_TOKEN
    names = execwork.build(["true"]).event_metrics()
    assert len(names) == 2 * len(workloads.EVENTS)
    assert [n for n in names if not UNIT_TOKEN.search(n)] == []


# ---------------------------------------------------------------- per syscall

def test_a_stays_events_are_metrics_of_the_stay_family_and_ask_for_stays_and_events():
    from mmlab.workloads import syscalls
    wl = pageout()
    m = wl.metric("advise_syscall_madvise_kernel_ipis_per_page")
    assert m.unit == "events" and "IPIs sent" in m.help and "the syscall madvise" in m.help
    assert wl.metric("prefault_fault_kernel_store_bytes_per_call").unit == "bytes"
    assert wl.metric("advise_syscall_madvise_kernel_insns_per_call").unit == "insns"  # as before
    asked = ["advise_syscall_madvise_kernel_retired_insns_per_call"]
    assert syscalls.wanted(wl, asked) and insns.events_arg(wl, asked) == ("events=blocks",)
    assert insns.events_arg(wl, ["post_touch_fault_kernel_loads_per_page"]) == ("events=on",)
    with pytest.raises(MmlabError, match="an event in place of insns"):
        wl.metric("advise_syscall_madvise_kernel_ipi_per_call")


def test_plugin_stay_events_become_per_call_and_per_unit_metrics():
    from mmlab.workloads import syscalls
    r = json.loads(record({"ipis": [6, 0]}))
    r["stays"] = [{}] + [{"syscall_madvise": [2, 600], "fault": [4, 400]}] + [{}] * 6
    r["stay_events"] = [{}] + [{"syscall_madvise": {"ipis": 6, "stores": 10}}] + [{}] * 6
    got = [sample({"advise_units": 10.0})]
    syscalls.from_plugin(pageout(), got, json.dumps(r))
    m = got[0].metrics
    assert m["advise_syscall_madvise_kernel_ipis_per_call"] == 3.0       # 6 over 2 calls
    assert m["advise_syscall_madvise_kernel_ipis_per_page"] == 0.3       # 2 windows, 10 pages
    assert m["advise_syscall_madvise_kernel_stores_per_call"] == 5.0
    assert "advise_fault_kernel_ipis_per_call" not in m                  # none counted for it
    assert m["advise_fault_kernel_insns_per_call"] == 100.0


def test_mmlab_workloads_says_the_event_family_exists():
    out = mmlab("workloads").stdout
    assert "<window>_{kernel,user}_<event>_per_<unit>" in out and "retired_insns" in out
