"""The audit's findings that no verdict carries, where a user reads an
experiment: `compare` on the terminal and `report` (its text, which the
HTML page holds whole).

A finding that makes a pair not comparable is said in that pair's reason.
The others would be said nowhere: a finding no verdict rests on (a
kernel's saved boots that disagree, `guest states differ`), and every
finding of an arm that is in no pair, as in a one-arm experiment (eight
trials of one kernel over several saved boots) where nothing is judged.

`compare --json` and `--csv` give the same as fields of each comparison
(`fields`; `columns` for CSV): the audit's findings on its
pair, and what a counted figure counts, which the text says in its legend
(fmt.count_legend).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mmlab.judge.states import STATE_KEY
from mmlab.report.fmt import count_source
from mmlab.workloads import CALLS, COUNT_NAME, insns

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from mmlab.experiment.plan import Plan
    from mmlab.judge.audit import Finding
    from mmlab.judge.comparison import Comparison
    from mmlab.judge.verdicts import Judgement
    from mmlab.workloads.samples import Sample

# How a rep-prefixed string instruction counts in an instruction figure, by
# counter (fmt.COUNTED_BY's keys): the plugin's per iteration, perf's once.
REP_STRING = {"plugin": "per iteration", "perf": "once"}
# The CSV columns of `counted`, empty for a figure that is not a count.
COUNTED_COLUMNS = ("counts", "side", "per", "counter", "counter_baseline", "exact", "rep_string",
                   "guest_states", "guest_states_baseline")


def noted(judged: Judgement, metrics: Sequence[str], pairs: bool = True) -> dict[str, list[str]]:
    """Heading ("A vs B", "arm A") -> the findings, in words and once each,
    that no verdict rests on: of each pair (with `pairs`) those that concern
    none of `metrics` but a neighbour's (each comparison's `beside` says
    those), and all of an arm in no pair."""
    out: dict[str, list[str]] = {}
    for (arm, base), found in judged.findings.items() if pairs else ():
        said = [str(f) for f in found
                if not f.beside and not any(f.matters_for(m) for m in metrics)]
        if said:
            out[f"{arm} vs {base}"] = list(dict.fromkeys(said))
    paired = {name for pair in judged.findings for name in pair}
    for arm, found in judged.arm_findings.items():
        if found and arm not in paired:
            out[f"arm {arm}"] = list(dict.fromkeys(map(str, found)))
    return out



def fields(plan: Plan, judged: Judgement, samples: Mapping[str, Sequence[Sample]],
           c: Comparison) -> dict[str, object]:
    """What `compare --json` adds to a comparison, so that a script reads
    what the text says beside the table: `counted` (None for a figure that
    is not a count) and `audit`, the audit's findings on its pair."""
    return {"counted": counted(plan, samples, c), "audit": findings(judged, c)}


def findings(judged: Judgement, c: Comparison) -> list[dict[str, object]]:
    """The audit's findings on the comparison's pair, once each: its check,
    arms, detail, a neighbour that may explain it (`beside`), and whether
    this comparison's verdict rests on it (`decides`: not comparable); the
    others are what the text lists as noted."""
    return [{"check": f.check, "arms": list(f.arms), "detail": f.detail, "beside": f.beside,
             "decides": f.matters_for(c.metric)} for f in _on_pair(judged, c)]


def _on_pair(judged: Judgement, c: Comparison) -> list[Finding]:
    """The findings on the comparison's pair, once each (an arm's own are
    listed with each pair it is in)."""
    return list({str(f): f for f in judged.findings.get((c.arm, c.baseline), [])}.values())


def counted(plan: Plan, samples: Mapping[str, Sequence[Sample]],
            c: Comparison) -> dict[str, object] | None:
    """What a counted figure counts, as fields: what (`counts`: insns, an
    event, a stay's calls), in which mode (`side`) and per what unit of
    work (`per`, read from its name as COUNT_NAME spells it), each arm's
    counter (fmt.COUNTED_BY's keys, from its samples), `exact` where
    both are the TCG plugin's, how a rep-prefixed string instruction counts
    in an instruction figure, and how many saved boots each arm's trials
    started from (0: booted guests, each its own state), the exactness
    holding for one state; None for a figure that is not a count."""
    if not insns.counted(plan.workload, c.metric):
        return None
    named = COUNT_NAME.fullmatch(c.metric)
    if named and named[1]:       # <window>_<side>_<insns or event>_per_<unit>
        what, side, per = named[2], named[1], c.metric.rpartition("_per_")[2]
    else:                        # <window>_<stay>_calls: kernel entries, per window
        what, side, per = CALLS, "kernel", "window"
    with_it = {arm: [s for s in samples.get(arm, []) if c.metric in s.metrics]
               for arm in (c.arm, c.baseline)}
    counter = {arm: ",".join(sorted({count_source(s.state) for s in ss})) or "unrecorded"
               for arm, ss in with_it.items()}
    states = {arm: len({v for s in ss if (v := s.state.get(STATE_KEY))})
              for arm, ss in with_it.items()}
    return {"counts": what, "side": side, "per": per, "counter": counter[c.arm],
            "counter_baseline": counter[c.baseline],
            "exact": counter[c.arm] == counter[c.baseline] == "plugin",
            "rep_string": _rep_string(what, set(counter.values())),
            "guest_states": states[c.arm], "guest_states_baseline": states[c.baseline]}


def _rep_string(what: str, counters: set[str]) -> str:
    """How a rep-prefixed string instruction counts in an instruction
    figure: per iteration (the plugin's instructions), once (perf's, and
    the plugin's retired_insns event), "mixed" where the arms' counters
    differ; "" in a figure of other events or of calls."""
    if what == "retired_insns":
        return "once"
    if what != insns.UNIT:
        return ""
    return REP_STRING.get(counters.pop(), "") if len(counters) == 1 else "mixed"


def columns(plan: Plan, judged: Judgement, samples: Mapping[str, Sequence[Sample]],
            c: Comparison) -> dict[str, object]:
    """`fields` as CSV columns: COUNTED_COLUMNS, `audit_checks` (the checks
    that found something on the pair, for a spreadsheet's filter) and
    `audit_notes` (those no verdict of it rests on, in words, as the text
    lists them: one a neighbour may explain is in the `beside` column)."""
    count = counted(plan, samples, c) or {}
    found = _on_pair(judged, c)
    return {**{k: count.get(k, "") for k in COUNTED_COLUMNS},
            "audit_checks": "; ".join(dict.fromkeys(f.check for f in found)),
            "audit_notes": "; ".join(str(f) for f in found
                                     if not f.beside and not f.matters_for(c.metric))}
