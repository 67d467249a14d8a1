"""`compare --json` and `--csv` carry what compare's text says beside its
table: the same-state audit's findings on each comparison's pair (noted or
deciding), and what a counted figure counts, as fields a script reads."""

from __future__ import annotations

import csv
import io
import json

from mmlab.experiment.plan import pairs, parse
from mmlab.judge import audit, verdicts
from mmlab.report import csv as report_csv
from mmlab.report import json as report_json
from mmlab.targets import TargetPool

from .test_guest_states import COUNT, PROFILE, _boots, _mmlab, _StatesTarget

PLUGIN = {"insns_source": "qemu tcg plugin", "accelerator": "tcg"}


def _counted_by_the_plugin(target: _StatesTarget) -> _StatesTarget:
    """The target's samples as a TCG guest's counting pass gives them."""
    model = target.model
    target.model = lambda arm: (model(arm)[0], {**model(arm)[1], **PLUGIN})
    return target


def test_compare_json_and_csv_carry_the_audits_notes_and_what_a_count_counts(
        tmp_path, monkeypatch):
    """A pair whose kernels' saved boots disagree (noted, no verdict rests
    on it): each JSON comparison lists the finding and says its count is the
    plugin's, exact, rep strings per iteration, over two saved boots; the
    CSV has the same as columns a spreadsheet filters on, and so have the
    evidence bundle's summary.json and verdicts.csv."""
    mmlab = _mmlab(tmp_path, monkeypatch)
    target = _counted_by_the_plugin(_StatesTarget())
    monkeypatch.setattr(TargetPool, "local_target", lambda pool, arm: target)
    profile = tmp_path / "pair.toml"
    profile.write_text(PROFILE)
    mmlab("experiment", "run", str(profile), "--no-controls")
    (c,) = json.loads(raw(tmp_path, "compare", "1", "--json"))
    assert c["counted"] == {"counts": "insns", "side": "kernel", "per": "page",
                            "counter": "plugin", "counter_baseline": "plugin", "exact": True,
                            "rep_string": "per iteration", "guest_states": 2,
                            "guest_states_baseline": 2}
    noted = [f for f in c["audit"] if f["check"] == audit.STATES_DIFFER]
    assert {tuple(f["arms"]) for f in noted} == {(c["arm"],), (c["baseline"],)}, c["audit"]
    assert all(not f["decides"] and "saved boots of debian:6.12" in f["detail"] for f in noted)
    (row,) = csv.DictReader(io.StringIO(raw(tmp_path, "compare", "1", "--csv")))
    assert row["audit_checks"] == audit.STATES_DIFFER and row["exact"] == "True"
    assert row["counter"] == "plugin" and row["rep_string"] == "per iteration"
    assert row["audit_notes"].count(f"{audit.STATES_DIFFER}: arm ") == 2, row
    # The evidence bundle's comparisons carry the same.
    raw(tmp_path, "bundle", "1", str(tmp_path / "b"))
    (kept,) = json.loads((tmp_path / "b" / "summary.json").read_text())["comparisons"]
    assert kept["counted"] == c["counted"] and kept["audit"] == c["audit"]
    (kept_row,) = csv.DictReader(io.StringIO((tmp_path / "b" / "verdicts.csv").read_text()))
    assert kept_row["audit_checks"] == row["audit_checks"] and kept_row["exact"] == "True"


def raw(tmp_path, *args: str) -> str:
    """A command's stdout as printed (no whitespace made single)."""
    from typer.testing import CliRunner

    from mmlab.cli import app
    ran = CliRunner().invoke(app, [*args, "--results", str(tmp_path / "r")])
    assert ran.exit_code == 0, ran.output
    return ran.stdout


def test_a_finding_a_verdict_rests_on_is_marked_and_a_time_says_it_counts_nothing():
    """Boots that explain the pair's difference make the count not
    comparable: its finding `decides`, the other arm's boots that disagree
    do not and are the CSV's note; a timed metric's `counted` is null and
    its count columns empty."""
    plan = parse(PROFILE.replace(f'"{COUNT}"', f'"{COUNT}", "advise_ns_per_page"'))
    (pair,) = pairs(plan)
    samples = {pair.arm.name: _boots(("0:aa", [1151, 1152, 1150]), ("1:bb", [1304, 1303, 1305])),
               pair.baseline.name: _boots(("0:cc", [1200] * 3), ("1:dd", [1201] * 3))}
    for ss in samples.values():
        for s in ss:
            s.state.update(PLUGIN)
            s.metrics["advise_ns_per_page"] = 5.0
    judged = verdicts.judge(plan, samples)
    by_metric = {c["metric"]: c for c in json.loads(report_json.comparisons(plan, judged,
                                                                            samples))}
    count, time = by_metric[COUNT], by_metric["advise_ns_per_page"]
    assert count["verdict"] == "not comparable" and time["counted"] is None
    decides = {f["check"]: f["decides"] for f in count["audit"]}
    assert decides == {audit.STATES_EXPLAIN: True, audit.STATES_DIFFER: False}, count["audit"]
    assert {f["check"]: f["decides"] for f in time["audit"]} == {
        audit.STATES_EXPLAIN: False, audit.STATES_DIFFER: False}
    rows = {r["metric"]: r for r in csv.DictReader(io.StringIO(
        report_csv.comparisons(plan, judged, samples)))}
    assert set(rows[COUNT]["audit_checks"].split("; ")) == {audit.STATES_EXPLAIN,
                                                           audit.STATES_DIFFER}
    assert audit.STATES_EXPLAIN not in rows[COUNT]["audit_notes"]
    assert audit.STATES_DIFFER in rows[COUNT]["audit_notes"]
    assert rows["advise_ns_per_page"]["counts"] == rows["advise_ns_per_page"]["exact"] == ""


def test_a_count_perf_gave_is_not_exact_and_retires_a_rep_string_once():
    """The baseline counted by perf (a host), the arm by the plugin: the
    fields name each counter, call neither exact and say the two count
    rep strings differently; both by perf, once and not exact."""
    plan = parse(PROFILE)
    (pair,) = pairs(plan)
    samples = {pair.arm.name: _boots(("0:aa", [1151.0] * 3)),
               pair.baseline.name: _boots(("0:cc", [1200.0] * 3))}
    for arm, ss in samples.items():
        for s in ss:
            s.state["insns_source"] = "qemu tcg plugin" if arm == pair.arm.name else "perf"
    (c,) = json.loads(report_json.comparisons(plan, verdicts.judge(plan, samples), samples))
    assert {k: c["counted"][k] for k in ("counter", "counter_baseline", "exact", "rep_string")} \
        == {"counter": "plugin", "counter_baseline": "perf", "exact": False,
            "rep_string": "mixed"}
    for s in samples[pair.arm.name]:
        s.state["insns_source"] = "perf"
    (c,) = json.loads(report_json.comparisons(plan, verdicts.judge(plan, samples), samples))
    assert (c["counted"]["exact"], c["counted"]["rep_string"]) == (False, "once")


def test_an_event_a_syscall_and_its_calls_each_say_what_they_count():
    """Per event, per syscall call and a syscall's calls: what is counted,
    in which mode and per what, and how rep strings count in it."""
    figures = {"advise_kernel_retired_insns_per_page": ("retired_insns", "page", "once"),
               "advise_kernel_locked_insns_per_page": ("locked_insns", "page", ""),
               "advise_syscall_madvise_kernel_insns_per_call": ("insns", "call",
                                                                "per iteration"),
               "advise_syscall_madvise_calls": ("calls", "window", "")}
    plan = parse(PROFILE.replace(f'"{COUNT}"', ", ".join(f'"{m}"' for m in figures)))
    (pair,) = pairs(plan)
    samples = {arm: _boots(("0:aa", [1.0] * 3), ("1:bb", [1.0] * 3))
               for arm in (pair.arm.name, pair.baseline.name)}
    for ss in samples.values():
        for s in ss:
            s.state.update(PLUGIN)
            s.metrics = dict.fromkeys(figures, 100.0)
    found = json.loads(report_json.comparisons(plan, verdicts.judge(plan, samples), samples))
    assert {c["metric"]: (c["counted"]["counts"], c["counted"]["per"],
                          c["counted"]["rep_string"]) for c in found} == figures
    assert all(c["counted"]["side"] == "kernel" and c["counted"]["exact"] for c in found)
