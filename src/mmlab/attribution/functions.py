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

Inclusive counts (`calls=PATH`, qemu-plugin/calls.h): the plugin follows
each vCPU's kernel calls on a shadow stack and gives each called function
the instructions from its entry to its return, its callees included, under
the stay (syscall, fault, ...) it ran in; `calls_text` tells it where the
functions start and which code is a thunk or the context switch.  A call
into the middle of a function (return-stack stuffing) is no function's
entry and is left out.

This is an attribution run: the per-block callbacks slow TCG, and the
counts are exact whatever the speed, so it never shares a boot with timing.
"""

from __future__ import annotations

import bisect
import functools
import gzip
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from mmlab.errors import MmlabError
from mmlab.kernels import qemu_plugin
from mmlab.workloads import PATH_STAY, Workload, insns
from mmlab.workloads.samples import Sample

TEXT_TYPES = frozenset("tTwW")
KALLSYMS_TEXT = re.compile(r"^([0-9a-f]{16}) [Tt] _text$", re.M)
UNRESOLVED = "[unresolved: modules or outside the kernel text]"
# A /trial.sh line run after mmwork: where this boot's kernel text starts.
SCRIPT_AFTER = ("grep -m1 ' _text$' /proc/kallsyms >&2 || true",)
# The script that reads a kernel's text symbols once (module symbols, which
# move from boot to boot, are left out), gzipped and base64'd for the serial port.
DUMP_SCRIPT = "grep -E '^[0-9a-f]+ [tTwW] [^ ]+$' /proc/kallsyms | gzip -1 | base64 -w0\n"
# Code a call passes through on its way to the callee, or a return on its
# way back (retpolines, return thunks, their mitigations' variants).
THUNK = re.compile(r"__x86_indirect_(call_|jump_|its_)?thunk_|__x86_return_thunk$|"
                   r"__x86_return_skl$|srso_|retbleed_|zen_untrain_ret$|entry_untrain_ret$|"
                   r"its_return_thunk$|call_depth_return_thunk$|entry_ibpb$")
SWITCH = "__switch_to_asm"        # from here the kernel stack is another task's
# The kernel's entry and exit code: its labels are jumped to, never tail calls.
ENTRY_TEXT = ("__entry_text_start", "__entry_text_end")


def text_symbols(path: Path) -> list[tuple[int, str]]:
    """(address, name) of each text symbol of a gzipped System.map or
    kallsyms, in the file's order."""
    pairs = []
    for line in gzip.decompress(path.read_bytes()).decode(errors="replace").splitlines():
        f = line.split()
        if len(f) == 3 and f[1] in TEXT_TYPES:
            pairs.append((int(f[0], 16), f[2]))
    return pairs


class SymbolTable:
    """A kernel's text symbols as offsets from `_text`, sorted."""

    def __init__(self, offsets: list[int], names: list[str], end: int):
        self.offsets, self.names, self.end = offsets, names, end

    @classmethod
    def load(cls, path: Path) -> SymbolTable:
        """A gzipped System.map or kallsyms (kernels.Kernel.symbols)."""
        pairs = text_symbols(path)
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

    def starting(self, offset: int) -> str | None:
        """The function that starts at `offset`, or None (a call into the
        middle of one)."""
        i = bisect.bisect_right(self.offsets, offset) - 1
        return self.names[i] if i >= 0 and self.offsets[i] == offset < self.end else None

    def size(self, i: int) -> int:
        """Symbol i's text: to the next symbol at another address."""
        nxt = bisect.bisect_right(self.offsets, self.offsets[i])
        return max((self.offsets[nxt] if nxt < len(self.offsets) else self.end)
                   - self.offsets[i], 1)


def calls_text(table: SymbolTable) -> str:
    """The plugin's calls= file (calls.h's read_calls): every function's
    start outside the entry code, the thunks' and the context switch's
    ranges."""
    at = {n: o for o, n in zip(table.offsets, table.names, strict=True) if n in ENTRY_TEXT}
    entry = range(*(at[n] for n in ENTRY_TEXT)) if len(at) == 2 else range(0)
    out = []
    for i, (offset, name) in enumerate(zip(table.offsets, table.names, strict=True)):
        if name == SWITCH:
            out.append(f"X {offset:x} {table.size(i):x}")
        elif THUNK.match(name):
            out.append(f"T {offset:x} {table.size(i):x}")
        elif offset not in entry:
            out.append(f"F {offset:x}")
    return "\n".join(out) + "\n"


@functools.cache
def calls_args(symbols: Path) -> tuple[str, ...]:
    """The plugin's calls= argument for a kernel's symbols: the file is
    made once per run and kept in the plugin's cache by what it holds."""
    return (qemu_plugin.file_arg("calls", calls_text(SymbolTable.load(symbols))),)


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
    # With calls=: per window, each called function's instructions with its
    # callees', per unit; its calls per unit; the same by path (a syscall's
    # entry function and what it called, or a fault's, ...: "other" outside
    # them); each stay's calls and instructions per unit, of the same boot;
    # the interrupts taken inside each stay, which no function's count holds
    # (their number and instructions per unit); and the frames dropped where
    # the stack could not be followed (a context switch).  Inclusive counts
    # overlap and never add up.
    inclusive: dict[str, dict[str, float]] = {}
    calls: dict[str, dict[str, float]] = {}
    paths: dict[str, dict[str, dict[str, float]]] = {}
    stays: dict[str, dict[str, list[float]]] = {}
    interrupts: dict[str, dict[str, list[float]]] = {}
    frames_cut: dict[str, int] = {}

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
                         kernel_release=release, text_address=text, dropped_blocks=dropped,
                         **inclusive(workload, units, output, sample_records, table, text))


def inclusive(workload: Workload, units: dict[str, float], output: str,
              sample_records: list[dict], table: SymbolTable, text: int) -> dict:
    """FunctionInsns' inclusive fields from the plugin's "calls" lines
    (none without calls=) and the sample records' stays."""
    by_window = {r["window"]: r for r in insns.plugin_records(output, "calls")}
    if not by_window:
        return {}
    out: dict = {"inclusive": {}, "calls": {}, "paths": {}, "stays": {}, "interrupts": {},
                 "frames_cut": {}}
    for w in workload.windows:
        n = units[w.name]
        if not n or w.marker not in by_window:
            continue
        out["frames_cut"][w.name] = by_window[w.marker]["cut"]
        out["interrupts"][w.name] = {stay or "other": [taken / n, count / n] for stay, (
            taken, count) in by_window[w.marker]["interrupts"].items()}
        incl, calls, paths = (out[k].setdefault(w.name, {})
                              for k in ("inclusive", "calls", "paths"))
        for address, stay, count, called in by_window[w.marker]["entries"]:
            name = table.starting(address - text)
            if name is None:
                continue
            incl[name] = incl.get(name, 0.0) + count / n
            calls[name] = calls.get(name, 0.0) + called / n
            path = paths.setdefault(stay or "other", {})
            path[name] = path.get(name, 0.0) + count / n
        stays: dict[str, list[float]] = out["stays"].setdefault(w.name, {})
        for r in sample_records:
            for stay, (called, count) in r["stays"][w.marker].items():
                got = stays.setdefault(stay, [0.0, 0.0])
                got[0] += called / n
                got[1] += count / n
    return out


# A counting pass with calls= (a trial's, not an attribution run's) keeps
# each followed path's inclusive counts as metrics of its own,
# <window>_<stay>_incl_<function>_kernel_insns_per_call: instructions of the
# function with all it calls, per call of the syscall (or fault, exception)
# whose path it is on, for the functions holding at least FOLLOW_SHARE of
# the path's largest (its entry function's).  One trial's figure, over its
# measured samples (the plugin sums calls at exit), in each of its samples.
INCLUSIVE = "incl"
FOLLOW_SHARE = 0.1
SERIES_NAME = re.compile(r"[a-z_][a-z0-9_]*")    # a function a metric's name can hold


def function_of(symbol: str) -> str:
    """The function a text symbol compiles: its name without a compiler's
    clone suffix (foo.isra.0, foo.constprop.0, foo.part.0, foo.cold), since
    one release inlines what another clones, and a series, a change's
    coverage or a variant's reach is the function's."""
    return symbol.partition(".")[0]


def inclusive_metrics(workload: Workload, samples: list[Sample], output: str,
                      symbols: Path) -> None:
    """The plugin's "calls" lines (calls= in a counting pass) as the samples'
    inclusive metrics, named by `symbols`: a clone goes by its function's
    name where the function itself did not run (foo.part.0 beside foo is
    inside foo's count), clones of one function adding up.  Nothing where
    the plugin followed no calls."""
    lines = {r["window"]: r for r in insns.plugin_records(output, "calls")}
    if not lines:
        return
    table = SymbolTable.load(symbols)
    records = insns.sample_records(output, samples)
    found: dict[str, float] = {}
    for w in workload.windows:
        if w.marker not in lines:
            continue
        calls: dict[str, float] = {}
        for r in records:
            for stay, (called, _) in r["stays"][w.marker].items():
                calls[stay] = calls.get(stay, 0.0) + called
        for stay, funcs in _paths(lines[w.marker], table).items():
            if calls.get(stay):
                found.update({f"{w.name}_{stay}_{INCLUSIVE}_{name}_kernel_insns_per_call":
                              count / calls[stay] for name, count in funcs.items()})
    for s in samples:
        s.metrics.update(found)


def _paths(line: dict, table: SymbolTable) -> dict[str, dict[str, float]]:
    """One window's calls line as each followed stay's functions (by their
    series name) holding FOLLOW_SHARE of its largest."""
    paths: dict[str, dict[str, float]] = {}
    for address, stay, count, _ in line["entries"]:
        name = table.starting(address - line["text"])
        if name and PATH_STAY.fullmatch(stay):
            funcs = paths.setdefault(stay, {})
            funcs[name] = funcs.get(name, 0.0) + count
    out: dict[str, dict[str, float]] = {}
    for stay, funcs in paths.items():
        top = max(funcs.values())
        named = out.setdefault(stay, {})
        for name, count in funcs.items():
            base = function_of(name)
            if (not SERIES_NAME.fullmatch(base) or count < FOLLOW_SHARE * top
                    or (base != name and base in funcs)):
                continue
            named[base] = named.get(base, 0.0) + count
    return out


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
    """One function's kernel instructions per unit on both sides of a pair;
    a rename is one row, the baseline's name in `renamed_from`."""
    function: str
    per_unit: float
    per_unit_baseline: float
    renamed_from: str = ""

    @property
    def change(self) -> float:
        return self.per_unit - self.per_unit_baseline

    @property
    def label(self) -> str:
        return f"renamed {self.renamed_from} -> {self.function}" if self.renamed_from \
            else self.function


# A function only the baseline has and one only the arm has are one renamed
# function when both run at least RENAME_FLOOR instructions per unit and
# their counts are within RENAME_TOLERANCE of each other (a release renames
# a helper, or the compiler's suffix changes: foo.constprop.0 -> foo.isra.0).
RENAME_TOLERANCE = 0.02
RENAME_FLOOR = 1.0


def renames(gone: dict[str, float], new: dict[str, float]) -> list[FunctionChange]:
    """Pairs of a function `gone` (baseline only) and one `new` (arm only)
    with nearly the same count, closest pairs first, each name used once."""
    near = sorted((abs(y / x - 1), g, m) for g, x in gone.items() for m, y in new.items()
                  if min(x, y) >= RENAME_FLOOR and abs(y / x - 1) <= RENAME_TOLERANCE)
    out, used = [], set()
    for _, g, m in near:
        if g not in used and m not in used:
            out.append(FunctionChange(m, new[m], gone[g], renamed_from=g))
            used |= {g, m}
    return out


def moved(fa: dict[str, float], fb: dict[str, float], n: int) -> list[FunctionChange]:
    """The `n` counts that moved most between `fb` (baseline) and `fa`, both
    ways, renames paired into one row; those that did not move are left out."""
    paired = renames({f: v for f, v in fb.items() if f not in fa},
                     {f: v for f, v in fa.items() if f not in fb})
    named = {r.function for r in paired} | {r.renamed_from for r in paired}
    rows = paired + [FunctionChange(f, fa.get(f, 0.0), fb.get(f, 0.0))
                     for f in (fa.keys() | fb.keys()) - named if fa.get(f, 0.0) != fb.get(f, 0.0)]
    return sorted(rows, key=lambda r: (-abs(r.change), r.function))[:n]


def changes(a: FunctionInsns, base: FunctionInsns, window: str, n: int) -> list[FunctionChange]:
    """The `n` functions whose exclusive instructions per unit moved most."""
    return moved(a.windows.get(window, {}), base.windows.get(window, {}), n)
