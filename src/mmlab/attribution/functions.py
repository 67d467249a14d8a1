"""Kernel instructions per function inside the timed windows, from a TCG
boot that counts them by translation block.

mmlab's QEMU plugin, loaded with `blocks=on`, sums each kernel block's
instructions per timed window by the block's start address (qemu-plugin/
insns.c).  Here each address is named by the kernel's symbols
(kernels.Kernel.symbols: a build's System.map, or the kernel's own
/proc/kallsyms read once from a guest): the function whose text contains
it.  The guest kernel runs at a random offset (KASLR), so symbols are kept
as offsets from `_text`, and the counting boot prints its own `_text` from
/proc/kallsyms after the workload.  Blocks in modules (or in no function
the table knows) are kept as unresolved, never dropped: the functions and
the unresolved part add up to the plugin's own window totals, which is
checked.

This is an attribution run: the per-block callbacks slow TCG, and the
counts are exact whatever the speed, so it never shares a boot with timing.
"""

from __future__ import annotations

import bisect
import gzip
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from mmlab.errors import MmlabError
from mmlab.workloads import Workload, insns
from mmlab.workloads.samples import Sample

TEXT_TYPES = frozenset("tTwW")
KALLSYMS_TEXT = re.compile(r"^([0-9a-f]{16}) [Tt] _text$", re.M)
UNRESOLVED = "[unresolved: modules or outside the kernel text]"
# A /trial.sh line run after mmwork: where this boot's kernel text starts.
SCRIPT_AFTER = ("grep -m1 ' _text$' /proc/kallsyms >&2 || true",)
# The script that reads a kernel's text symbols once (module symbols, which
# move from boot to boot, are left out), gzipped and base64'd for the serial port.
DUMP_SCRIPT = "grep -E '^[0-9a-f]+ [tTwW] [^ ]+$' /proc/kallsyms | gzip -1 | base64 -w0\n"


class SymbolTable:
    """A kernel's text symbols as offsets from `_text`, sorted."""

    def __init__(self, offsets: list[int], names: list[str], end: int):
        self.offsets, self.names, self.end = offsets, names, end

    @classmethod
    def load(cls, path: Path) -> SymbolTable:
        """A gzipped System.map or kallsyms (kernels.Kernel.symbols)."""
        pairs = []
        for line in gzip.decompress(path.read_bytes()).decode(errors="replace").splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in TEXT_TYPES:
                pairs.append((int(f[0], 16), f[2]))
        by_name = {n: a for a, n in pairs}
        if "_text" not in by_name or not by_name["_text"]:
            raise MmlabError(f"{path}: no _text address (a placeholder System.map, or "
                             "kallsyms read with its addresses hidden)")
        base = by_name["_text"]
        pairs = sorted((a - base, n) for a, n in pairs if a >= base)
        end = by_name.get("_etext", pairs[-1][0] + base) - base
        return cls([a for a, _ in pairs], [n for _, n in pairs], end)

    def function(self, offset: int) -> str | None:
        """The function whose text holds `offset` (from `_text`), or None."""
        i = bisect.bisect_right(self.offsets, offset) - 1
        if i < 0 or offset >= self.end:
            return None
        return self.names[i]


def text_address(stderr: str) -> int:
    """Where this boot's kernel text starts, from the line SCRIPT_AFTER printed."""
    m = KALLSYMS_TEXT.search(stderr)
    if not m or not int(m.group(1), 16):
        raise MmlabError("the guest printed no _text address from /proc/kallsyms (kallsyms "
                         "off, or addresses hidden by kptr_restrict)")
    return int(m.group(1), 16)


class FunctionInsns(BaseModel):
    """What one per-block counting boot stores for a guest arm: per timed
    window, kernel instructions per unit of work by function (all of them
    that ran), the window's own kernel total, and the part no function of
    System.map holds."""
    windows: dict[str, dict[str, float]]   # window -> function -> insns per unit
    kernel: dict[str, float]               # window -> the plugin's kernel insns per unit
    unresolved: dict[str, float]           # window -> insns per unit in no known function
    units: dict[str, str]                  # window -> the unit ("page", "migrated_page")
    kernel_release: str
    text_address: int                      # this boot's `_text` (KASLR moved it)
    dropped_blocks: int = 0                # blocks past the plugin's table: in `kernel` only

    def top(self, window: str, n: int) -> list[tuple[str, float]]:
        funcs = self.windows.get(window, {})
        return sorted(funcs.items(), key=lambda kv: -kv[1])[:n]


def window_units(workload: Workload, samples: list[Sample],
                 records: list[dict]) -> dict[str, float]:
    """Per window, the units of work all measured windows did: each sample's
    counted windows (the plugin's `records`) times the units one window did
    (mmwork's)."""
    return {w.name: sum(r["windows"][w.marker][0] * s.counts.get(insns.units_count(w.name), 0.0)
                        for s, r in zip(samples, records, strict=True))
            for w in workload.windows}


def attribute(workload: Workload, samples: list[Sample], output: str, stderr: str,
              symbols: Path, release: str) -> FunctionInsns:
    """The plugin's per-block output of one boot, named by `symbols`."""
    table = SymbolTable.load(symbols)
    text = text_address(stderr)
    sample_records = insns.sample_records(output, samples)
    units = window_units(workload, samples, sample_records)
    by_window = {r["window"]: r for r in insns.plugin_records(output, "blocks")}
    if not by_window:
        raise MmlabError("the QEMU plugin wrote no per-block counts (blocks=on)")
    dropped = next(iter(by_window.values()))["dropped"]   # the plugin's, in every line
    windows, kernel, unresolved = {}, {}, {}
    for w in workload.windows:
        n = units[w.name]
        if not n:
            continue
        funcs: dict[str, float] = {}
        blocks = by_window.get(w.marker, {"blocks": [], "exact": True})
        for address, count in blocks["blocks"]:
            name = table.function(address - text) or UNRESOLVED
            funcs[name] = funcs.get(name, 0.0) + count
        plugin_total = sum(r["windows"][w.marker][1] for r in sample_records)
        if not dropped:
            _check_sum(w.name, sum(funcs.values()), plugin_total, blocks.get("exact", True))
        unresolved[w.name] = funcs.pop(UNRESOLVED, 0.0) / n
        windows[w.name] = {f: c / n for f, c in funcs.items()}
        kernel[w.name] = plugin_total / n
    return FunctionInsns(windows=windows, kernel=kernel, unresolved=unresolved,
                         units={w.name: w.unit for w in workload.windows if w.name in windows},
                         kernel_release=release, text_address=text, dropped_blocks=dropped)


# A window over several vCPUs: the other vCPUs may count a block on the
# wrong side of its begin or end (the plugin's "exact": false).
OVER_VCPUS = 0.001


def _check_sum(window: str, by_block: float, total: float, exact: bool = True) -> None:
    """The blocks of a window add up to the window's kernel total, exactly
    (the plugin drops an unmatched window's blocks with its total), unless
    the plugin's block table was full; a window over several vCPUs to
    within OVER_VCPUS of its total."""
    if by_block != total and (exact or abs(by_block - total) > OVER_VCPUS * total):
        raise MmlabError(f"window {window}: per-block counts add up to {by_block:.0f} of the "
                         f"plugin's {total:.0f} kernel instructions")


@dataclass(frozen=True)
class FunctionChange:
    """One function's kernel instructions per unit on both sides of a pair."""
    function: str
    per_unit: float
    per_unit_baseline: float

    @property
    def change(self) -> float:
        return self.per_unit - self.per_unit_baseline


def changes(a: FunctionInsns, base: FunctionInsns, window: str, n: int) -> list[FunctionChange]:
    """The `n` functions whose instructions per unit moved most, both ways
    (those that did not move at all are left out)."""
    fa, fb = a.windows.get(window, {}), base.windows.get(window, {})
    rows = [FunctionChange(f, fa.get(f, 0.0), fb.get(f, 0.0)) for f in fa.keys() | fb.keys()
            if fa.get(f, 0.0) != fb.get(f, 0.0)]
    return sorted(rows, key=lambda r: (-abs(r.change), r.function))[:n]
