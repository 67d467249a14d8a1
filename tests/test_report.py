"""Reports and bundles, on a store filled with known samples (so verdicts and
the regzbot line are predictable), golden files of the text and HTML
reports, and one live bundle whose reproducer is built with gcc alone and run.

The goldens are tests/golden/report.txt and report.html, rendered from a
fixture store built here through the Store API (a hand-made workload table,
plan, samples, environments and attribution: no mmwork, no clock, no
machine facts).  After an intended change to what reports say, regenerate
them with

    MMLAB_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_report.py -k golden

and read the diff of tests/golden/ before committing it.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from mmlab.attribution.events import EventCounts
from mmlab.attribution.functions import FunctionInsns
from mmlab.attribution.guest import GuestTrace
from mmlab.attribution.locks import Contention, LockWaits
from mmlab.attribution.stacks import StackProfile
from mmlab.experiment import profile as profile_model
from mmlab.experiment.plan import Arm, Plan, parse, with_kernels
from mmlab.experiment.schedule import schedule
from mmlab.report import bundle, data, fmt, html, reproducer, text
from mmlab.store import Store
from mmlab.workloads import Metric, Param, Workload, registry
from mmlab.workloads.build import WORKLOAD_SRC
from mmlab.workloads.samples import Sample

from .conftest import check_golden, mmlab, run_profile

# Four rounds of two comparisons: only tests without the family correction
# can call them (Holm would need p < 0.025, four rounds give 0.029 at best).
PROFILE = """\
name = "kernels"
description = "pageout on two kernels, CPUs 1 and 2"
workload = "pageout-refault"
repetitions = 5
metrics = ["cycle_ns_per_page"]
baseline = { kernel = "debian:6.1" }
correction = "none"
[params]
mapping-kb = 1024
[matrix]
kernel = ["debian:6.1", "debian:6.12"]
cpus = [1, 2]
"""


def fake_sample(value: float, kernel: str) -> Sample:
    return Sample(workload="pageout-refault", sample=0, mmwork_version="t", params={},
                  metrics={"cycle_ns_per_page": value}, counts={"pages": 256.0},
                  rusage=dict.fromkeys(("user_s", "sys_s", "minflt", "majflt", "nvcsw",
                                        "nivcsw"), 0.0),
                  vmstat_delta={}, state={"kernel": kernel, "accelerator": "tcg",
                                          "target": "qemu"}, errors={})


@pytest.fixture
def store_with_results(tmp_path) -> tuple[Store, int]:
    """6.12 is 30 % slower than 6.1; the last round never ran (interrupted)."""
    plan = parse(PROFILE, "kernels.toml")
    store = Store(tmp_path / "r")
    exp = store.create_experiment(plan)
    for t in store.trials(exp):
        if t.round == 4:
            continue
        base = 1000.0 + 7 * t.round
        value = base * (1.3 if "6.12" in t.arm else 1.0)
        store.start_trial(t.id)
        store.finish_trial(t.id, [fake_sample(value, t.arm)], {"kernel": "6.18", "cpus": 2,
                                                                "cpu_model": "x", "governor": "-",
                                                                "mmlab_version": "0",
                                                                "git_commit": "abc"})
    return store, exp


def test_text_report_fits_a_mailing_list_and_says_everything(store_with_results):
    d = data.gather(*store_with_results)
    report = text.render(d)
    lines = report.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert "\x1b" not in report                                   # no colour
    for section in ("What was run", "Environment", "Results", "Same-state audit", "Missing",
                    "Reproduce"):
        assert section in lines
    assert "kernel: debian:6.12 vs debian:6.1" in report
    head = lines.index("  kernel: debian:6.12 vs debian:6.1") + 1
    assert lines[head].split()[:3] == ["cpus", "debian:6.1", "debian:6.12"]   # axis values
    row = lines[head + 1]
    assert row.split()[0] == "1" and "+30.0%" in row and "1.300" in row and "regression" in row
    assert "tcg (emulated timings" in report
    assert "4 of 20 trials did not run (interrupted)" in report
    assert lines[-1] == "#regzbot introduced: 6.1..6.12"


def test_compare_says_which_figures_are_emulated(store_with_results):
    """Every rendering of a verdict on a TCG guest's time labels it emulated;
    the same figures from the host are not."""
    from rich.console import Console

    from mmlab.judge import verdicts
    from mmlab.report import csv as report_csv
    from mmlab.report import json as report_json
    from mmlab.report.terminal import experiment
    store, exp = store_with_results
    plan, measured = store.plan(exp), store.measurements(exp)
    judged = verdicts.judge(plan, measured)
    out = Console(record=True, width=220)
    experiment.print_verdicts(out, exp, plan, measured, judged)
    assert "regression, emulated" in out.export_text()
    by_arm = measured.by_arm
    assert all(row["emulated"] for row in json.loads(report_json.comparisons(plan, judged, by_arm)))
    assert report_csv.comparisons(plan, judged, by_arm).splitlines()[1].endswith(",True")
    report = text.render(data.gather(store, exp))
    assert "regression*" in report and "* emulated time: measured in a TCG guest" in report
    host = replace(judged, tcg=frozenset())
    rows = json.loads(report_json.comparisons(plan, host, by_arm))
    assert not any(row["emulated"] for row in rows)


def test_html_report_is_self_contained_and_renders(store_with_results, tmp_path, chromium):
    page = html.render(data.gather(*store_with_results))
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page
    assert page.count("data:image/png;base64,") >= 3               # samples, ratios, scaling
    out = tmp_path / "report.html"
    out.write_text(page)
    shot = Path(__file__).resolve().parents[1] / "build" / "screenshots" / "report.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-quic", "--no-first-run", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1300,1800",
                           f"--screenshot={shot}", out.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert shot.stat().st_size > 20_000                          # a page was drawn


def test_bundle_has_every_file_and_a_manifest_that_checks(store_with_results, tmp_path):
    out = bundle.write(data.gather(*store_with_results), tmp_path / "b", tar=True)
    root = tmp_path / "b"
    assert out == tmp_path / "b.tar.gz" and out.stat().st_size > 0
    for name in ("README.md", "profile.toml", "env.json", "execution_order.json", "raw.csv",
                 "raw.json", "summary.csv", "summary.json", "MANIFEST.sha256"):
        assert (root / name).is_file(), name
    assert list((root / "plots").glob("*.png"))
    order = json.loads((root / "execution_order.json").read_text())
    assert len(order) == 20 and {o["status"] for o in order} == {"done", "planned"}
    for line in (root / "MANIFEST.sha256").read_text().splitlines():
        digest, name = line.split("  ", 1)
        assert hashlib.sha256((root / name).read_bytes()).hexdigest() == digest
    assert len(list(root.glob("reproducer-*.c"))) == 4


def test_the_reproducer_builds_with_gcc_alone_and_prints_the_same_metrics(tmp_path):
    run, results = run_profile(tmp_path, PROFILE.replace(
        'kernel = ["debian:6.1", "debian:6.12"]\ncpus = [1, 2]', 'thp = ["hugepage", "nohugepage"]')
        .replace('baseline = { kernel = "debian:6.1" }', 'baseline = { thp = "nohugepage" }')
        .replace("repetitions = 5", "repetitions = 3"))
    assert run.returncode == 0, run.stderr
    made = mmlab("bundle", "1", str(tmp_path / "b"), "--results", str(results))
    assert made.returncode == 0, made.stderr
    src = tmp_path / "b" / "reproducer-thp_hugepage.c"
    subprocess.run(["gcc", "-O2", "-o", str(tmp_path / "repro"), str(src)], check=True)
    proc = subprocess.run([str(tmp_path / "repro"), "--samples", "2", "--min-ms", "0"],
                          capture_output=True, text=True, check=True)
    samples = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(samples) == 2
    assert samples[0]["params"]["thp"] == "hugepage" and samples[0]["params"]["mapping-kb"] == 1024
    # instruction counts need --insns and a source, CPU time --cpu-time
    wl = registry()["pageout-refault"]
    assert set(samples[0]["metrics"]) == \
        {m.name for m in wl.metrics} - wl.window_metrics() - wl.cpu_metrics()
    report = mmlab("report", "1", "--results", str(results))
    assert "thp: hugepage vs nohugepage" in report.stdout


def test_the_makefile_and_every_reproducer_use_the_one_harness_list(tmp_path):
    """workloads/harness.list is the only list of the harness files: make builds
    mmwork from its .c files in its order, and each reproducer is its files in
    its order, local includes dropped, then the workload."""
    pieces = reproducer.harness()
    dry = subprocess.run(["make", "-n", "-B", "-C", str(WORKLOAD_SRC), f"OUT={tmp_path}"],
                         capture_output=True, text=True, check=True).stdout
    core_c = [p.name for p in pieces if p.suffix == ".c"]
    assert [w for w in dry.split() if w.endswith(".c")][:len(core_c)] == core_c
    for wl in registry().values():
        src = reproducer.source(wl, {}, "t")
        assert not re.search(r'^\s*#\s*include\s+"', src, re.M), wl.name
        # Each file opens with " * <its name> - <its one concern>".
        at = [src.index(f" * {p.name} - ") for p in pieces]
        assert at == sorted(at), wl.name
        assert f'.name = "{wl.name}"' in src[at[-1]:]


def test_a_report_of_an_ab_run_that_never_started_names_the_patch(tmp_path):
    plan = parse(PROFILE, "kernels.toml")
    derived = with_kernels(plan, ["build:a", "build:b"],
                           "A/B of fix.patch sha256 0123456789abcdef")
    store = Store(tmp_path / "r")
    exp = store.create_experiment(derived)
    report = text.render(data.gather(store, exp))
    assert "this run: A/B of fix.patch sha256 0123456789abcdef" in report
    assert "20 of 20 trials did not run" in report
    assert "has 0 samples; verdicts need 3" in report
    assert all(len(line) <= 80 for line in report.splitlines())


# ---------------------------------------------------------------- golden files


GOLDEN_PROFILE = """\
# golden fixture: written by tests/test_report.py, never run
name = "golden"
description = "pageout and refault with and without THP, on this kernel and in a guest"
workload = "pageout-refault"
repetitions = 6
metrics = ["cycle_ns_per_page", "advise_ns_per_page"]
baseline = { thp = "nohugepage" }
focus = "do_madvise"
[params]
mapping-kb = 1024
[matrix]
kernel = ["host", "debian:6.12"]
thp = ["hugepage", "nohugepage"]
"""

WORKLOAD = Workload(
    name="pageout-refault", seed="001", summary="MADV_PAGEOUT of a THP mapping, then refault",
    params=(Param("mapping-kb", "size_kb", "4096", "mapping size"),
            Param("thp", "choice", "hugepage", "THP mode of the mapping",
                  choices=("hugepage", "nohugepage"))),
    metrics=(Metric("cycle_ns_per_page", "ns", "lower", "pageout and refault (median round, "
                    "per page)"),
             Metric("advise_ns_per_page", "ns", "lower", "MADV_PAGEOUT (median round, per page)")),
    mm_paths=("shrink_folio_list",), vmstat=("thp_split_page",), tracepoints=("vmscan",),
    host_settings=())

# Per arm: (cycle, advise) medians; None: the metric is missing (so NaN figures).
MEDIANS = {"kernel=host,thp=hugepage": (1400.0, 200.0),
           "kernel=host,thp=nohugepage": (1000.0, 400.0),
           "kernel=debian:6.12,thp=hugepage": (3010.0, 900.0),
           "kernel=debian:6.12,thp=nohugepage": (3000.0, None)}
JITTER = (1.0, 1.01, 0.99, 1.02, 0.98)          # per round: the samples' spread
ENV = {"kernel": "6.18.0-golden", "cpus": 2, "cpu_model": "Golden CPU @ 2.0GHz",
       "governor": "performance", "turbo": "off", "mmlab_version": "0.1.0",
       "git_commit": "0123456789ab"}
GUEST_ENV = {"target": "qemu", "guest_kernel": "debian:6.12",
             "guest_kernel_version": "6.12.0-golden", "guest_kernel_source": "linux-image (golden)"}


def golden_plan(text: str = GOLDEN_PROFILE) -> Plan:
    """The plan `parse` would make of `text`, without asking mmwork."""
    profile = profile_model.Profile.model_validate(tomllib.loads(text))
    arms = [Arm(name=f"kernel={kernel},thp={thp}", values={"kernel": kernel, "thp": thp},
                params={**profile.params, "thp": thp}, kernel=kernel)
            for kernel in profile.matrix["kernel"] for thp in profile.matrix["thp"]]
    return Plan(profile=profile, text=text, path="experiments/golden.toml",
                workload=WORKLOAD, arms=arms,
                order=schedule([a.name for a in arms],
                               profile.repetitions, profile.seed))


def golden_sample(arm: Arm, rnd: int) -> Sample:
    cycle, advise = MEDIANS[arm.name]
    huge = arm.values["thp"] == "hugepage"
    where = ({"target": "host"} if arm.kernel == "host"
             else {"target": "qemu", "accelerator": "tcg", "guest_kernel": arm.kernel})
    return Sample(workload=WORKLOAD.name, sample=0, mmwork_version="golden", params=arm.params,
                  metrics={"cycle_ns_per_page": cycle * JITTER[rnd],
                           "advise_ns_per_page": advise and advise * JITTER[rnd]},
                  counts={"pages": 256.0},
                  rusage=dict.fromkeys(("user_s", "sys_s", "minflt", "majflt", "nvcsw",
                                        "nivcsw"), 0.0),
                  vmstat_delta={"pgfault": 256.0, **({"thp_split_page": 1.0} if huge else {})},
                  state={**where, "thp_backed_fraction": 1.0 if huge else 0.0}, errors={})


def golden_functions(huge: bool) -> FunctionInsns:
    """Kernel instructions per page by function in the advise window."""
    advise = {"shrink_folio_list": 145.25, "page_vma_mapped_walk": 230.5,
              **({"__folio_split": 101.0} if huge else {})}
    return FunctionInsns(windows={"advise": advise}, kernel={"advise": sum(advise.values()) + 3},
                         unresolved={"advise": 3.0}, units={"advise": "page"},
                         kernel_release="6.12.117+deb13-cloud-amd64", text_address=0)


def golden_attribution(arm: Arm) -> dict[str, dict]:
    """Host arms: stacks, locks and tracepoints; guest arms: an in-guest trace."""
    huge = arm.values["thp"] == "hugepage"
    if arm.kernel != "host":
        calls = 1024.0 if huge else 512.0
        return {"guest_trace": GuestTrace(
            trace={"trace_calls.shrink_folio_list": calls,
                   "trace_total_us.shrink_folio_list": calls * 3.5,
                   "trace_max_us.shrink_folio_list": 41.25,
                   "trace_skipped.split_huge_page_to_list_to_order": 1.0},
            units=1024.0, unit="pages", accelerator="tcg").model_dump(),
                "functions": golden_functions(huge).model_dump()}
    split = "__madvise;do_madvise;shrink_folio_list;__folio_split 61440\n" if huge else ""
    folded = (split + "__madvise;do_madvise;shrink_folio_list;pageout 40960\n"
              "__madvise;do_madvise;lru_add_drain 10240\n"
              "refault;handle_mm_fault;do_anonymous_page 51200\n")
    metrics = {"cycle_ns_per_page": MEDIANS[arm.name][0] * 1.1}
    return {
        "stacks": StackProfile(folded=folded, units=256, unit="pages",
                               metrics=metrics).model_dump(),
        "locks": Contention(
            waits=[LockWaits("00000000abe5191", 40, 1200.0, 90.5)],
            callers={"folio_lruvec_lock_irqsave <- folio_batch_move_lru <- lru_add_drain_cpu": 30,
                     "folio_lruvec_lock_irqsave <- __page_cache_release <- folios_put_refs": 10},
            metrics_waits=metrics, metrics_stacks=metrics).model_dump(),
        "events": EventCounts(
            systems=["vmscan"], counts={"vmscan:mm_vmscan_write_folio": 512 if huge else 256},
            lost=7 if huge else 0, units=256, unit="pages", metrics=metrics).model_dump()}


def fill_golden_store(store: Store, plan: Plan) -> int:
    """Every trial done, except one failed boot and the last round (never run)."""
    exp = store.create_experiment(plan)
    for t in store.trials(exp):
        arm = plan.arm(t.arm)
        if t.round == plan.profile.repetitions - 1:
            continue
        store.start_trial(t.id)
        env = ENV if arm.kernel == "host" else {**ENV, **GUEST_ENV}
        if t.round == 2 and arm.name == "kernel=debian:6.12,thp=hugepage":
            store.fail_trial(t.id, "guest did not boot: Kernel panic; console: ...", env)
            continue
        store.finish_trial(t.id, [golden_sample(arm, t.round)], env)
    for arm in plan.arms:
        for kind, found in golden_attribution(arm).items():
            store.save_attribution(exp, arm.name, kind, found)
    return exp


@pytest.fixture
def golden(tmp_path) -> data.ReportData:
    store = Store(tmp_path / "r")
    return data.gather(store, fill_golden_store(store, golden_plan()))


def normalised_html(page: str) -> str:
    """PNG bytes depend on matplotlib and its fonts: only their place is compared."""
    return re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "data:image/png;base64,PNG", page)


def test_golden_text_report(golden):
    check_golden("report.txt", text.render(golden))


def test_golden_html_report(golden):
    check_golden("report.html", normalised_html(html.render(golden)))


def test_reports_read_the_stored_environment_not_this_machine(tmp_path, monkeypatch):
    """The host kernel in a regzbot line is the one the trials recorded."""
    import platform
    monkeypatch.setattr(platform, "release", lambda: "0.0.0-not-this")
    plan = golden_plan(GOLDEN_PROFILE.replace('baseline = { thp = "nohugepage" }',
                                              'baseline = { kernel = "host" }'))
    store = Store(tmp_path / "r")
    exp = store.create_experiment(plan)
    for t in store.trials(exp):
        if t.round == plan.profile.repetitions - 1:
            continue
        sample = golden_sample(plan.arm(t.arm), t.round)
        sample.state = {}                   # the same state, so the pair is comparable
        store.start_trial(t.id)
        store.finish_trial(t.id, [sample], ENV)
    report = text.render(data.gather(store, exp))
    assert report.splitlines()[-1] == "#regzbot introduced: v6.18.0..6.12"


# ---------------------------------------------------------------- whole at any width


def every_label_whole(shown: str, plan: Plan, judged, width: int) -> None:
    """Each comparison's metric and arm label on one line, each arm's name
    and every column's header whole, no line past `width`."""
    lines = shown.splitlines()
    assert max(map(len, lines)) <= width
    for c in judged.comparisons:
        label = fmt.contrast(plan, c.arm, c.baseline).label
        assert any(c.metric in line and label in line for line in lines), (c.metric, label)
    for arm in plan.arms:
        assert any(arm.name in line for line in lines), arm.name
    for header in ("baseline", "change", "ratio", "CI", "p adj.", "rounds", "verdict"):
        assert header in shown


@pytest.mark.parametrize("width", [80, 120])
def test_compare_keeps_every_column_whole_at_80_and_120_columns(tmp_path, width):
    """Too narrow for the table, the verdicts print as records (a row's
    labels on a line, its figures under one header) instead of squeezing
    the 'arm vs baseline' column to nothing."""
    from rich.console import Console

    from mmlab.judge import verdicts
    from mmlab.report.terminal import experiment
    store = Store(tmp_path / "r")
    exp = fill_golden_store(store, golden_plan())
    plan, measured = store.plan(exp), store.measurements(exp)
    judged = verdicts.judge(plan, measured)
    out = Console(record=True, width=width)
    experiment.print_verdicts(out, exp, plan, measured, judged)
    every_label_whole(out.export_text(), plan, judged, width)


def test_compare_in_a_pipe_keeps_every_column_whole(tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    store = Store(tmp_path / "r")
    exp = fill_golden_store(store, golden_plan())
    proc = mmlab("compare", str(exp), "--results", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    from mmlab.judge import verdicts
    plan = store.plan(exp)
    every_label_whole(proc.stdout, plan, verdicts.judge(plan, store.measurements(exp)), 140)


def test_the_text_report_wraps_prose_and_never_cuts_a_name_or_a_command(tmp_path, monkeypatch):
    """A long profile path and kernel names longer than a column: prose
    wraps at 80 between words, every name stays whole, and the Reproduce
    commands run as pasted (continuation lines included)."""
    long = "debian:6.12.117+deb13-cloud-amd64"
    for thp in ("hugepage", "nohugepage"):
        monkeypatch.setitem(MEDIANS, f"kernel={long},thp={thp}",
                            MEDIANS[f"kernel=debian:6.12,thp={thp}"])
    path = str(tmp_path / "profiles-kept-by-the-reporter" / "seed004-ksm-rmap-insns-6.12-7.3.toml")
    plan = golden_plan(GOLDEN_PROFILE.replace('"debian:6.12"]', f'"{long}"]').replace(
        'baseline = { thp = "nohugepage" }', 'baseline = { kernel = "host" }'))
    store = Store(tmp_path / "r")
    exp = fill_golden_store(store, plan.model_copy(update={"path": path}))
    report = text.render(data.gather(store, exp))
    lines = report.splitlines()
    assert all(len(line) <= 80 for line in lines if path not in line)
    assert f"  kernel: {long} vs host" in lines
    assert any(line.endswith(path) for line in lines[:lines.index("Environment")])
    pasted = "\n".join(lines[lines.index("Reproduce") + 1:lines.index("Reproduce") + 6])
    shell = (pasted.replace(".venv/bin/mmlab", "printf '%s\\n'").replace("make setup", "true")
             .replace("<ID>", "1"))
    ran = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True)
    assert ran.stdout.splitlines() == ["experiment", "run", path, "compare", "1"]
