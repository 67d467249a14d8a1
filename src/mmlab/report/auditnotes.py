"""The audit's findings that no verdict carries, where a user reads an
experiment: `compare` on the terminal and `report` (its text, which the
HTML page holds whole).

A finding that makes a pair not comparable is said in that pair's reason.
The others would be said nowhere: a finding no verdict rests on (a
kernel's saved boots that disagree, `guest states differ`), and every
finding of an arm that is in no pair, as in a one-arm experiment (eight
trials of one kernel over several saved boots) where nothing is judged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from mmlab.judge.verdicts import Judgement


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

