"""Every counted figure says what it counts: `compare`, the text and HTML
reports and `explain` of a store with instruction metrics (the fake target,
its samples labelled as the real targets label them) define "insns" once,
by the counter the samples name, and explain's by-function totals are set
beside the trials' own counts, agreeing or saying why not."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmlab.attribution import explain
from mmlab.attribution.functions import FunctionInsns
from mmlab.experiment.plan import parse
from mmlab.report import data, fmt, html, text
from mmlab.run import runner
from mmlab.store import Store

from .conftest import mmlab
from .fake_target import FakeTarget, fake_pool

PROFILE = """\
name = "counted"
workload = "pageout-refault"
repetitions = 7
metrics = ["advise_kernel_insns_per_page", "advise_ns_per_page"]
baseline = { kernel = "debian:6.1" }
[params]
mapping-kb = 1024
[matrix]
kernel = ["debian:6.1", "debian:6.12"]
"""
PLUGIN = {"accelerator": "tcg", "target": "qemu",
          "insns_source": "qemu tcg plugin, separate counting pass"}
PERF = {"accelerator": "kvm", "target": "qemu",     # a KVM guest with a vPMU counts with perf
        "insns_source": "perf, separate counting pass"}
ADVISE = {"shrink_folio_list": 145.25, "page_vma_mapped_walk": 230.5}


def counted_store(tmp_path: Path, states=None,
                  functions: float | None = None, metrics: str | None = None) -> Path:
    """6.12 counts 1.3x its baseline (0.1% spread); `states[kernel]`: the
    samples' state (plugin counts by default); `functions`: each arm's
    attribution boot counts this many times what its trials counted."""
    judged = '"advise_kernel_insns_per_page", "advise_ns_per_page"'
    plan = parse(PROFILE.replace(judged, metrics or judged), "counted.toml")
    results = tmp_path / "r"
    store = Store(results)
    exp = store.create_experiment(plan)
    states = states or {}

    def model(arm):
        return 1.3 if arm.kernel == "debian:6.12" else 1.0, states.get(arm.kernel, PLUGIN)

    runner.run(store, exp, plan, fake_pool(FakeTarget(cv=0.001, model=model)))
    if functions is not None:
        for arm, ss in store.measurements(exp).by_arm.items():
            total = {w: functions * sorted(s.metrics[f"{w}_kernel_insns_per_page"]
                                           for s in ss)[len(ss) // 2]
                     for w in ("advise", "prefault")}
            funcs = {w: {**ADVISE, "do_madvise": t - sum(ADVISE.values()) - 3.0}
                     for w, t in total.items()}
            store.save_attribution(exp, arm, "functions", FunctionInsns(
                windows=funcs, kernel=total, unresolved=dict.fromkeys(total, 3.0),
                units=dict.fromkeys(total, "page"), kernel_release="6.12.0",
                text_address=0).model_dump())
    return results


def test_compare_report_and_explain_say_what_a_count_counts(tmp_path):
    """As a new user reads them: the legend once in each output, naming the
    TCG plugin, exactness and rep string instructions; the time still
    marked emulated; the figure's statistic named (the mean window)."""
    results = counted_store(tmp_path, functions=1.0)
    compared = mmlab("compare", "1", "--results", str(results))
    assert compared.returncode == 0, compared.stderr
    out = " ".join(compared.stdout.split())
    assert out.count("insns: the kernel or user instructions") == 1
    assert "counted exactly by QEMU's TCG plugin" in out and "once per iteration" in out
    assert "regression, emulated" in out
    report = mmlab("report", "1", "--results", str(results))
    said = " ".join(report.stdout.split())
    assert report.returncode == 0 and said.count("insns: the kernel or user instructions") == 1
    assert "counted exactly by QEMU's TCG plugin" in said
    assert "advise_kernel_insns_per_page [mean window]" in said
    assert "regression*" in said and "* emulated time" in said
    page = html.render(data.gather(Store(results), 1))
    assert page.count("insns: the kernel or user instructions") == 2   # its own and the text's
    explained = mmlab("explain", "1", "--results", str(results))
    told = " ".join(explained.stdout.split())
    assert explained.returncode == 0 and "one attribution boot per arm" in told
    assert ("advise_kernel_insns_per_page in compare (the median of the trials' counts): "
            "400.3 -> 520.1; the totals above agree with them within 0.0%") in told


def test_explain_says_why_its_totals_differ_from_compares(tmp_path):
    """An attribution boot that counted 5% more than the trials' median
    is shown beside it, with the gap and why a boot of its own differs."""
    store = Store(counted_store(tmp_path, functions=1.05))
    d = data.gather(store, 1)
    assert d.explanation is not None
    w, prefault = d.explanation.functions
    assert w.metric == "advise_kernel_insns_per_page" and w.judged
    assert "as the trials counted it" in fmt.beside_trials(prefault)    # not a judged metric
    assert w.counted == pytest.approx(d.judgement.comparisons[0].median)
    assert w.counted_baseline == pytest.approx(d.judgement.comparisons[0].median_baseline)
    said = fmt.beside_trials(w)
    assert "differ from them by +5.0% (baseline) and +5.0% (arm)" in said
    assert "a boot of its own" in said and "median over trials" in said
    assert said in " ".join(text.render(d).split())


def test_a_host_arms_perf_counts_are_labelled_as_perf_not_as_the_plugin(tmp_path):
    """Where the counts came from the host CPU's counter, that is said
    instead; arms counted by different counters are each named."""
    store = Store(counted_store(tmp_path, states={"debian:6.1": PERF, "debian:6.12": PERF}))
    d = data.gather(store, 1)
    [line] = fmt.count_legend(d.workload, d.plan.profile.metrics, d.samples)
    assert "CPU's own instruction counter through perf (perf's instructions)" in line
    assert "counts once," in line and "TCG plugin" not in line
    mixed = Store(counted_store(tmp_path / "mixed", states={"debian:6.1": PERF}))
    d = data.gather(mixed, 1)
    head, *by_arm = fmt.count_legend(d.workload, d.plan.profile.metrics, d.samples)
    assert head.startswith("insns:") and len(by_arm) == 2
    assert any(x.startswith("kernel=debian:6.1: counted by the CPU's own") for x in by_arm)
    assert any(x.startswith("kernel=debian:6.12: counted exactly by QEMU") for x in by_arm)


def test_outputs_without_a_counted_figure_have_no_count_legend(tmp_path):
    store = Store(counted_store(tmp_path, metrics='"advise_ns_per_page"'))
    d = data.gather(store, 1)
    assert fmt.count_legend(d.workload, d.plan.profile.metrics, d.samples) == []
    assert "insns:" not in text.render(d)


def test_a_window_the_trials_did_not_count_says_nothing_beside_its_totals():
    f = FunctionInsns(windows={"advise": ADVISE}, kernel={"advise": 379.0},
                      unresolved={"advise": 3.0}, units={"advise": "page"},
                      kernel_release="6.12.0", text_address=0)
    [w] = explain.explain_functions("a", f)
    assert w.counted is None and fmt.beside_trials(w) == ""
