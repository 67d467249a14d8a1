"""What reports say, word by word: a stored name that holds control or bidi
characters is printed escaped wherever a report shows it; a command's
placeholders are shown with the arms' values; an outlier line says how far
its trial is; no empty table; a plot's change is the table's."""

from __future__ import annotations

import html as markup
import re
import unicodedata

from mmlab.experiment.plan import parse
from mmlab.report import data, html, text
from mmlab.store import Store

from .conftest import mmlab
from .fake_target import FakeTarget
from .test_report import (
    ENV,
    GOLDEN_PROFILE,
    MEDIANS,
    PROFILE,
    fake_sample,
    fill_golden_store,
    golden_plan,
)

# What an older mmlab could store: RLO reverses what follows it, BEL rings,
# ESC starts a terminal sequence, a zero-width space hides itself.
HIDDEN_KERNEL = "debian:6.12\u202eevil\x1b[31m"
HIDDEN_NAME = "golden\x07\u200b"


def hidden(out: str) -> list[str]:
    """The control and format characters (Unicode Cc, Cf) in `out` a
    terminal would act on rather than show, line breaks apart."""
    return [f"U+{ord(c):04X}" for c in out
            if unicodedata.category(c) in ("Cc", "Cf") and c != "\n"]


def test_a_stored_name_with_control_characters_is_printed_escaped(tmp_path, monkeypatch):
    """An experiment stored before names were checked: its profile, arm and
    axis value names hold RLO, BEL, ESC and a zero-width space.  Every
    report shows them as escapes, on the terminal, as text and as HTML."""
    for thp in ("hugepage", "nohugepage"):
        monkeypatch.setitem(MEDIANS, f"kernel={HIDDEN_KERNEL},thp={thp}",
                            MEDIANS[f"kernel=debian:6.12,thp={thp}"])
    plan = golden_plan(GOLDEN_PROFILE.replace('name = "golden"', 'name = "golden\\u0007\\u200b"')
                       .replace('"debian:6.12"]', '"debian:6.12\\u202eevil\\u001b[31m"]'))
    assert plan.profile.name == HIDDEN_NAME and HIDDEN_KERNEL in plan.arms[-1].name
    store = Store(tmp_path / "r")
    exp = fill_golden_store(store, plan)
    d = data.gather(store, exp)
    shown = {"text": text.render(d), "html": html.render(d)}
    results = str(tmp_path / "r")
    for args in (["experiments"], ["show", str(exp)], ["compare", str(exp)],
                 ["explain", str(exp)], ["report", str(exp)]):
        proc = mmlab(*args, "--results", results, env={"COLUMNS": "200"})
        assert proc.returncode == 0, proc.stderr
        shown[args[0]] = proc.stdout
    for where, out in shown.items():
        assert not hidden(out), (where, hidden(out))
    for where in ("text", "html", "show", "compare", "report"):
        assert "debian:6.12\\u202eevil\\x1b[31m" in shown[where], where
    for where in ("text", "html", "experiments", "show"):
        assert "golden\\x07\\u200b" in shown[where], where


EXEC_LOOPS = """\
name = "loops"
workload = "exec"
command = ["true", "--loops", "{loops}", "--size", "{size}", "{verbose?-v}"]
repetitions = 3
metrics = ["outside_wall_s"]
baseline = { loops = 10 }
[params]
size = "4k"
verbose = true
[matrix]
loops = [10, 1000]
"""


def exec_store(tmp_path, profile: str, cv: float = 0.01, factors=None) -> data.ReportData:
    """`profile` planned and its trials run on the fake target, all stored."""
    plan = parse(profile, str(tmp_path / "p.toml"))
    store = Store(tmp_path / "r")
    exp = store.create_experiment(plan)
    fake = FakeTarget(cv=cv, factors=factors)
    for t in store.trials(exp):
        result = fake.run_trial(plan.arm(t.arm), plan)
        store.start_trial(t.id)
        store.finish_trial(t.id, result.samples, result.environment)
    return data.gather(store, exp)


def test_a_command_is_shown_with_its_arms_values_not_its_placeholders(tmp_path):
    """An exec workload's command as the reports state it: a parameter every
    arm shares filled in, one the arms differ in named once with its values."""
    d = exec_store(tmp_path, EXEC_LOOPS)
    page = html.render(d)
    page = page[:page.index("name = &#34;loops&#34;")]        # not the profile as written
    for out in (text.render(d), markup.unescape(page)):
        assert not re.search(r"\{(loops|size|verbose)", out)
        assert "true --loops <loops> --size 4k -v; <loops>: 10, 1000 by arm" in out


def test_an_outlier_line_says_how_far_its_trial_is(tmp_path):
    """A metric with a tiny spread (0.01 % between rounds) and one round
    0.4 % off: that round is an outlier of the round ratios, and its line
    gives the trial's factor with the digits that show it is not its
    median (x1.004, not x1.00)."""
    plan = parse(PROFILE.replace("repetitions = 5", "repetitions = 8"), "kernels.toml")
    store = Store(tmp_path / "r")
    exp = store.create_experiment(plan)
    jitter = {"6.1": (1, 1.0001, 0.9999, 1.0002, 0.9998, 1.0001, 0.9999, 1.0),
              "6.12": (1.0001, 1, 1.0002, 0.9999, 1.0, 0.9998, 1.0001, 0.9999)}
    for t in store.trials(exp):
        kernel = "6.12" if "6.12" in t.arm else "6.1"
        value = 1000.0 * jitter[kernel][t.round] * (1.3 if kernel == "6.12" else 1.0)
        if kernel == "6.12" and t.round == 5:
            value *= 1.004
        store.start_trial(t.id)
        store.finish_trial(t.id, [fake_sample(value, t.arm)], ENV)
    report = text.render(data.gather(store, exp))
    factors = re.findall(r"x(\d+\.\d+) its arm's median", " ".join(report.split()))
    assert factors, report
    assert all(float(f) != 1.0 for f in factors), factors
    assert "x1.004 its arm's median" in " ".join(report.split())


def test_no_empty_table_where_no_counter_moved(tmp_path):
    """`mmlab run` of samples that recorded no vmstat counter, and `mmlab
    explain` of a pair with no stacks and no counter or event that differs:
    one line each that says so, not a table's title over nothing."""
    from rich.console import Console

    from mmlab.attribution.explain import Explanation, PairExplanation
    from mmlab.report.terminal import attribution, experiment
    d = exec_store(tmp_path, EXEC_LOOPS)
    samples = d.samples["loops=10"]
    assert all(not s.vmstat_delta and not s.errors for s in samples)
    out = Console(record=True, width=120)
    experiment.print_samples(out, d.workload, samples)
    attribution.print_explanation(out, d.plan, Explanation([], [PairExplanation(
        "loops=1000", "loops=10", "pages", 1.0, 1.0, [], [], [])], [], [], None, {}))
    shown = out.export_text()
    assert "/proc/vmstat deltas" not in shown and "vmstat counters that differ" not in shown
    assert "/proc/vmstat: no counter recorded, and no errors" in shown
    assert "loops 1000 vs 10: no perf stacks, and no vmstat counter or event differs" in shown


def test_a_trend_plot_states_a_change_as_its_table_does():
    """The release cells put a step at +122.7 %; the pair's confirmation,
    measured side by side, at +122.1 %, which the dashboard's tables and
    the text summary state: the plot's cut bar is labelled with that too."""
    import math

    import matplotlib.pyplot as plt

    from mmlab.judge.comparison import Comparison
    from mmlab.report import fmt, plots
    from mmlab.track.cells import Point, Series
    from mmlab.track.changepoints import Change
    from mmlab.track.releases import Release

    def measured(r: float) -> Comparison:
        nan = math.nan
        return Comparison("m", "b", "a", 6, 6, nan, nan, r, r * 0.99, r * 1.01, nan, nan, nan,
                          nan, nan, "regression", "recorded")
    levels = {"6.12": None, "6.13": 1.01, "6.14": 1.01 * 2.227}
    s = Series("p", "m", "across", [Point(Release(f"debian:{k}", "1", k), r and measured(r), 1)
                                    for k, r in levels.items()])
    ch = Change("0000000001", "p", "m", "across", "6.13", "6.14", 2.227, measured(2.221),
                "regression")
    fig = plots.trend_figure(s, "debian:6.12", plots.marked(s, [ch]))
    labels = [t.get_text() for t in fig.axes[1].texts]
    plt.close(fig)
    assert labels == ["+122.1% (cut)"]
    assert fmt.change(fmt.step(ch)) == "+122.1%"           # what the tables say


def test_a_finding_no_verdict_rests_on_is_noted_not_called_not_comparable(tmp_path):
    """The audit's "guest states differ" concerns no verdict by itself: the
    report lists it as noted, and does not call the pair not comparable."""
    from mmlab.judge import audit
    plan = parse(PROFILE, "kernels.toml")
    store = Store(tmp_path / "r")
    exp = store.create_experiment(plan)
    for t in store.trials(exp):
        store.start_trial(t.id)
        store.finish_trial(t.id, [fake_sample(1000.0 * (1.3 if "6.12" in t.arm else 1),
                                              t.arm)], ENV)
    d = data.gather(store, exp)
    pair = next(iter(d.judgement.findings))
    assert not any(d.judgement.findings.values())
    d.judgement.findings[pair] = [audit.Finding(audit.STATES_DIFFER, pair, "boots apart",
                                                only=())]
    report = " ".join(text.render(d).split())
    assert "not comparable" not in report
    assert f"{pair[0]} vs {pair[1]}, noted (no verdict above rests on it): - " \
           f"{audit.STATES_DIFFER}: boots apart" in report
    assert "every compared pair ran in the same page state" in report
