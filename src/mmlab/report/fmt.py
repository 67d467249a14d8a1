"""How every report writes a number, a missing value, a change, a verdict, a
pair of arms and a file name, so the terminal, the text report, the HTML
report and the bundle cannot disagree (one dash for a missing value, never
"nan" in one place and "-" in another)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

from mmlab.experiment.plan import Plan
from mmlab.judge.comparison import Comparison
from mmlab.judge.criteria import Verdict
from mmlab.names import axis_text, shown
from mmlab.workloads import Metric, insns
from mmlab.workloads.execwork import PLACEHOLDER, RESERVED

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from mmlab.attribution.explain import CallPath, WindowFunctions
    from mmlab.track.changepoints import Change
    from mmlab.workloads import Workload
    from mmlab.workloads.samples import Sample

DASH = "-"


def printable(text: object, keep: str = "") -> str:
    """A user-given name (a profile's, an arm's, an axis value) or a text
    holding them, as every report prints it: a character a terminal does
    not show as itself (control and format characters: BEL, ESC, NUL, the
    bidi override RLO) written as an escape (\\x07, \\u202e; names.shown), so
    a name stored by an older mmlab can neither ring, restyle nor reorder
    the terminal, nor hide text in a page.  `keep`: the characters a whole
    text keeps (a report's line breaks)."""
    if not keep:
        return shown(str(text))
    return re.sub(f"[^{re.escape(keep)}]+", lambda m: shown(m.group()), str(text))


def finite(x: float | None) -> TypeGuard[float]:
    """A figure to show: None, NaN and infinities have none."""
    return x is not None and math.isfinite(x)


def num(x: float | None, digits: int = 4) -> str:
    """About `digits` significant digits, thousands separated; whole numbers whole."""
    if not finite(x):
        return DASH
    if float(x).is_integer():
        return f"{int(x):,}"
    mag = abs(x)
    if mag >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    return f"{x:.{max(0, digits - 1 - int(math.floor(math.log10(mag))))}f}"


def value(x: object) -> str:
    """A stored value of any kind (a page-state key's, say): a number as
    `num` writes it, anything else as it is."""
    return num(x) if isinstance(x, int | float) and not isinstance(x, bool) else str(x)


def pct(x: float | None) -> str:
    """A share: 0.125 -> 12.5%."""
    return f"{x * 100:.1f}%" if finite(x) else DASH


def spread(rcv: float) -> str:
    """A robust CV as a percentage, with the digits a count's needs."""
    if not math.isfinite(rcv):
        return "?"
    return f"{rcv:.2%}" if rcv < 0.001 else f"{rcv:.1%}"


def change(ratio: float | None) -> str:
    """A ratio as the signed change it means: 1.3 -> +30.0%."""
    return f"{ratio - 1:+.1%}" if finite(ratio) else DASH


def step(ch: Change) -> float:
    """A tracked change's after / before ratio, as every report states it
    (the dashboard's tables and the trend plot's step, the text summary):
    its confirmation's, the two releases measured side by side, where it
    has one (a count's medians' step: Change.step); else the series' cells'."""
    return ch.step


def ratio(x: float | None, suffix: str = "") -> str:
    return f"{x:.3f}{suffix}" if finite(x) else DASH


def ci(low: float | None, high: float | None) -> str:
    return f"{low:.3f}..{high:.3f}" if finite(low) and finite(high) else DASH


def p_value(p: float | None) -> str:
    return f"{p:.2g}" if finite(p) else DASH


def signed(x: float | None) -> str:
    """A difference in its own unit, as `num` writes figures: +641.2, -12.50,
    -49,643,429."""
    return ("-" if x < 0 else "+") + num(abs(x)) if finite(x) else DASH


def matched_state(label: str, c) -> str:
    """A matched-state control's verdict, said beside the different-state pair
    it controls: 'in matched state (thp=nohugepage): no change, ratio 0.970
    (90.0% CI 0.950..1.000)'."""
    level = f"{c.confidence:.1%} " if finite(c.confidence) else ""
    return (f"in matched state ({label}): {c.verdict}, ratio {ratio(c.ratio)} "
            f"({level}CI {ci(c.ci_low, c.ci_high)})")


# What one trial's figure of a metric is, as reports name it beside the figure.
STATISTICS = {
    "median round": "a trial's median round",
    "median mapping": "a trial's median mapping",
    "total/total": "a trial's total time (or ops) over its total pages (or time): the mean, "
                   "which reproducers and stress-ng print",
    "maximum": "the largest value in a trial",
    "as printed": "the figure the command printed",
    "mean window": "a trial's timed windows: their total over the units of work they did",
    "whole sample": "one figure for a trial's whole run",
}


def statistic(metric: Metric) -> str:
    """The statistic one trial's figure of `metric` is (a key of STATISTICS),
    read from the description its workload declares (mmwork describe, or an
    exec profile's declaration)."""
    h = metric.help
    if metric.name.endswith("_total") or "total time over total" in h or "total ops over" in h:
        return "total/total"
    for label in ("median round", "median mapping"):
        if label in h:
            return label
    if "maximum" in h:
        return "maximum"
    if "the mean window" in h:
        return "mean window"
    return "as printed" if "as the command prints it" in h else "whole sample"


def summary(plan: Plan) -> str:
    """What the workload runs, as its arms ran it.  An exec workload's
    summary is its command as written ("prog --loops {loops}"): a value
    every arm shares is filled in, and one the arms differ in is written
    <loops> and followed by the arms' values, so no report prints a
    template."""
    wl = plan.workload
    if wl.kind != "exec":
        return wl.summary
    notes: dict[str, str] = {}

    def fill(m: re.Match) -> str:
        name, flag = m.group(1), m.group(2)
        if name in RESERVED:
            return m.group(0)
        values = list(dict.fromkeys(a.params.get(name) for a in plan.arms))
        if len(values) > 1:
            listed = ", ".join(DASH if v is None else axis_text(v) for v in values)
            notes[name] = f"[{flag}] where {name} is true" if flag is not None else \
                f"<{name}>: {listed} by arm"
            return f"[{flag}]" if flag is not None else f"<{name}>"
        value = values[0] if values else None
        if flag is not None:
            return flag if value is True else ""
        return DASH if value is None else axis_text(value)
    words = [PLACEHOLDER.sub(fill, w) for w in wl.summary.split(" ")]
    return " ".join(w for w in words if w) + "".join(f"; {n}" for n in notes.values())


def arrow(metric: Metric) -> str:
    """Which way is better."""
    return "↑" if metric.higher_is_better else "↓"


# Rich markup for the terminal; colours for HTML and plots.
VERDICT_RICH = {Verdict.REGRESSION: "bold red", Verdict.IMPROVEMENT: "bold green",
                Verdict.NO_CHANGE: "cyan", Verdict.UNRELIABLE: "yellow",
                Verdict.NOT_COMPARABLE: "magenta"}
VERDICT_COLOR = {Verdict.REGRESSION: "#b00000", Verdict.IMPROVEMENT: "#007000",
                 Verdict.NO_CHANGE: "#225588", Verdict.UNRELIABLE: "#aa6600",
                 Verdict.NOT_COMPARABLE: "#880088"}


def verdict_label(c: Comparison, emulated: bool) -> str:
    """A comparison's verdict as a table shows it: of emulated time (a TCG
    guest's clock, judge/measurements.emulated), it says so."""
    return f"{c.verdict}, emulated" if emulated else str(c.verdict)


def verdict_class(v: Verdict) -> str:
    """The CSS class of a verdict: 'not comparable' -> 'not-comparable'."""
    return Verdict(v).replace(" ", "-")


@dataclass(frozen=True)
class Contrast:
    """What tells two arms apart, from their axis values in the plan."""
    differ: tuple[tuple[str, str, str], ...]   # (axis, baseline value, arm value)
    shared: tuple[tuple[str, str], ...] = ()   # the other axes and their common values
    by_name: bool = False                      # no axis tells them apart: ("arm", names)

    @property
    def axes(self) -> str:
        return ",".join(axis for axis, _, _ in self.differ)

    @property
    def baseline(self) -> str:
        return ",".join(b for _, b, _ in self.differ)

    @property
    def arm(self) -> str:
        return ",".join(a for _, _, a in self.differ)

    @property
    def others(self) -> str:
        """'cpus=2,thp=never'."""
        return ",".join(f"{k}={v}" for k, v in self.shared)

    @property
    def label(self) -> str:
        """'cpus=2: kernel debian:6.12 vs debian:6.1'; arms told apart by name:
        'huge vs small'."""
        if self.by_name:
            return f"{self.arm} vs {self.baseline}"
        differ = "; ".join(f"{k} {a} vs {b}" for k, b, a in self.differ)
        return f"{self.others}: {differ}" if self.shared else differ


def contrast(plan: Plan, arm: str, baseline: str) -> Contrast:
    """Arms with the same axes are told apart by the values that differ;
    others (explicit arms, an A/A pair) by their names."""
    a, b = plan.arm(arm).values, plan.arm(baseline).values
    differ = [k for k in a if axis_text(a[k]) != axis_text(b.get(k))]
    if not differ or a.keys() != b.keys():
        return Contrast((("arm", printable(baseline), printable(arm)),), by_name=True)
    return Contrast(tuple((printable(k), printable(axis_text(b[k])), printable(axis_text(a[k])))
                          for k in differ),
                    tuple((printable(k), printable(axis_text(a[k]))) for k in a
                          if k not in differ))


# What a counted figure (unit insns) counts, by where its samples say the
# counts came from (state insns_source); docs/instructions.md, "What a count
# counts", says which matches perf's `instructions` on a real machine.
COUNTED = "insns: the kernel or user instructions the metric's name says, per the unit it ends with"
COUNTED_BY = {
    "plugin": "counted exactly by QEMU's TCG plugin: every instruction the guest executed in the "
              "window, from the guest state its trial started in; a rep-prefixed string "
              "instruction counts once per iteration, so page clearing and copying weigh more "
              "than in perf's instructions on hardware",
    "perf": "counted by the CPU's own instruction counter through perf (perf's instructions): a "
            "rep-prefixed string instruction counts once, and the interrupts that land in the "
            "window add a little from trial to trial",
    "unrecorded": "from a counter the samples do not name",
}
# What an event metric (workloads.EVENTS: a guest's counting pass with events on) counts.
EVENTS_COUNTED = ("events: the kernel or user loads, stores, bytes, locked, TLB-invalidating, "
                  "IPI-sending, rep string or retired instructions the metric's name says, per "
                  "the unit it ends with, counted exactly by QEMU's TCG plugin in the counting "
                  "pass, from the guest state its trial started in; retired_insns counts a "
                  "rep-prefixed string instruction once, as perf's instructions on hardware")
AGREE = 0.01     # an attribution boot's window total this close to the trials' median agrees


def count_source(state: Mapping[str, object]) -> str:
    """A key of COUNTED_BY, from a sample's insns_source."""
    source = str(state.get(insns.SOURCE_KEY, ""))
    return ("plugin" if source.startswith("qemu tcg plugin") else
            "perf" if source.startswith("perf") else "unrecorded")


def count_legend(workload: Workload, metrics: Sequence[str],
                 samples: Mapping[str, Sequence[Sample]]) -> list[str]:
    """What every counted figure among `metrics` counts, said once per
    output: one line, or one per source naming its arms where the arms'
    counts came from different counters (a host arm's perf, a guest's
    plugin), and a line for the events; empty without a counted figure."""
    counted = [m for m in metrics if workload.metric(m).unit == insns.UNIT]
    arms_by: dict[str, list[str]] = {}
    for arm, ss in samples.items():
        for source in sorted({count_source(s.state) for s in ss
                              if any(m in s.metrics for m in counted)}):
            arms_by.setdefault(source, []).append(arm)
    events = [EVENTS_COUNTED] if any(workload.event_metric(m) for m in metrics) else []
    if len(arms_by) < 2:
        return [f"{COUNTED}, {COUNTED_BY[source]}" for source in arms_by] + events
    return [f"{COUNTED}:"] + [f"{', '.join(map(printable, arms))}: {COUNTED_BY[source]}"
                              for source, arms in arms_by.items()] + events


FUNCTIONS_LEGEND = ("kernel instructions by function: one attribution boot per arm, counted "
                    "by QEMU's TCG plugin block by block, exact for that boot (a rep-prefixed "
                    "string instruction once per iteration); the functions and the unresolved "
                    "rest add up to the window's total")


def beside_trials(w: WindowFunctions) -> str:
    """Whether a window's by-function totals agree with the trials' own
    count of it (the median `compare` judges), and if not, why they may
    differ; empty where the trials did not count the window."""
    gaps = w.gaps()
    if not gaps:
        return ""
    both = w.kernel_baseline is not None and finite(w.counted_baseline)
    trials = (f"{num(w.counted_baseline)} -> {num(w.counted)}" if both else num(w.counted))
    where = "in compare" if w.judged else "as the trials counted it"
    said = f"{w.metric} {where} (the median of the trials' counts): {trials}; the totals above"
    if all(abs(g) <= AGREE for g in gaps.values()):
        return f"{said} agree with them within {max(map(abs, gaps.values())):.1%}"
    by = " and ".join(f"{g:+.1%} ({side})" for side, g in gaps.items())
    return (f"{said} differ from them by {by}: the attribution boot "
            "is a boot of its own (its own free and per-CPU page lists, and, slowed by "
            "counting block by block, more timer interrupts inside each window), one run "
            "where compare takes the median over trials")


def call_path(p: CallPath, unit: str, top: int = 6) -> str:
    """A syscall's (or the faults') inclusive path in one line: its entry
    function with all it called, beside the whole stay, and the functions
    under it (each with its own callees: they overlap, never add up)."""
    paired = p.per_unit_baseline is not None
    def pair(x: float | None, y: float | None) -> str:
        return f"{num(y)} -> {num(x)}" if paired else num(x)
    stay = (f" (the whole {p.stay} stay {pair(p.stay_per_unit, p.stay_per_unit_baseline)}: "
            "also the kernel entry and exit code, interrupts and other tasks' runs inside)"
            if p.stay_per_unit is not None else "")
    if p.interrupts is not None or p.interrupts_baseline is not None:
        stay = _stay_parts(p, unit, pair)
    under = ", ".join(f"{r.label} {signed(r.change) if paired else num(r.per_unit)}"
                      for r in p.rows[:top]) or ("nothing moved" if paired else "none")
    return (f"{p.stay}, inclusive (a function with all it calls): {p.entry} "
            f"{pair(p.per_unit, p.per_unit_baseline)} /{unit}{stay}; under it: {under}")


def _stay_parts(p: CallPath, unit: str, pair: Callable[[float | None, float | None], str]) -> str:
    """What a stay holds beside its entry function's count, where the
    interrupts inside it were counted apart: those interrupts, and the
    rest that neither holds, so the three add up to the stay (a record
    from before, whose functions held them, shows none: `-`)."""
    insns = pair(*(x[1] if x is not None else None
                   for x in (p.interrupts, p.interrupts_baseline)))
    old = (" (a record counted before interrupts were taken out of the functions has -: "
           "its functions' counts hold them)" if None in (p.interrupts, p.interrupts_baseline)
           and p.per_unit_baseline is not None else "")
    said = (f"; interrupts inside it, in none of its functions' counts: "
            f"{pair(p.taken_per_call(), p.taken_per_call(True))} taken per call, "
            f"{insns} instructions /{unit}{old}")
    if p.stay_per_unit is None:
        return said
    return (f"{said}; the whole {p.stay} stay {pair(p.stay_per_unit, p.stay_per_unit_baseline)}"
            f" /{unit} is {p.entry}, its interrupts and {pair(p.rest(), p.rest(True))} more: the "
            f"kernel entry and exit code around {p.entry} and other tasks' runs while it "
            "was switched out")
