"""Whether a check's silence means something: for each function the series
changes (changes.py), whether any path of the check ran it on the base
kernel, in which profiles and windows, and where none did, the workload
variants that would (variants.py).  "No change" on a function no path ran
means "not measured", and the report says so.

What a path ran is the base kernel's instructions by function inside each
profile's timed windows (the plugin's per-block counts, attribution/
functions.py): a function ran when its symbols (or, inlined, its hosts')
counted any.  Function granularity: a path that ran a function did not
necessarily run the changed lines in it.

The compiled kernels say what the series changed in the code itself:
each function's size and place in the base's and the patched kernel's
symbol tables.  A series whose functions all keep their size moved code
at most (a layout change: instruction counts cannot see it), and where the
functions the paths ran kept their size while some moved, the check says
it only moved code there.

Records only: report/robot.py renders them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mmlab.attribution.functions import function_of, text_symbols
from mmlab.check.changes import Changed, Changes
from mmlab.check.variants import Table, Variant

# One profile's base counts: window -> symbol -> kernel instructions per
# unit, and window -> its unit.
Counts = tuple[dict[str, dict[str, float]], dict[str, str]]


@dataclass(frozen=True)
class Reached:
    profile: str
    window: str
    insns: float                # its symbols' kernel instructions per unit
    unit: str


@dataclass(frozen=True)
class FunctionCoverage:
    changed: Changed
    symbols: list[str]          # where its instructions are counted
    hosts: list[str]            # inlined: the functions it was compiled into
    why: str                    # why no path can run it ("" when one can)
    reached: list[Reached]
    suggestions: list[Variant]
    resized: bool | None        # a symbol of it changed size (None: not compared)

    @property
    def function(self) -> str:
        return self.changed.function

    @property
    def measurable(self) -> bool:
        return not self.why


@dataclass(frozen=True)
class Layout:
    """The base's and the patched kernel's functions compared by their
    symbols: those that changed size (or came or went), those that moved."""
    resized: list[str]
    moved: list[str]
    same: int
    ran: int = 0                # functions the paths ran
    ran_moved: int = 0          # of them, at a new address, the same size
    ran_resized: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.resized and not self.moved


@dataclass
class Coverage:
    functions: list[FunctionCoverage]
    parser: str                 # what found the functions' extents
    profiles: list[str]         # the profiles counted by function on the base
    layout: Layout | None       # None: a kernel without a symbol table
    table: str = ""             # the variants table's kernel ("" where none)
    seconds: float = 0.0        # what counting the base by function took here
    uncounted: list[str] = field(default_factory=list)   # profiles the base failed in

    @property
    def reached(self) -> list[FunctionCoverage]:
        return [f for f in self.functions if f.reached]

    @property
    def unreached(self) -> list[FunctionCoverage]:
        return [f for f in self.functions if f.measurable and not f.reached]

    @property
    def unknown(self) -> list[FunctionCoverage]:
        """Changed code whose reach cannot be told (no symbol to count)."""
        return [f for f in self.functions if not f.measurable and f.changed.code
                and not f.changed.new]

    @property
    def only_moved(self) -> bool:
        """No function the paths ran changed size, and some moved: where
        the paths ran, the series only moved code."""
        return bool(self.layout and self.layout.ran and not self.layout.ran_resized
                    and self.layout.ran_moved)


def needs_counts(changes: Changes, layout: Layout | None) -> bool:
    """Whether the base must be counted by function: some changed function
    can be counted, or the compiled kernels differ (a layout change is
    said only where the paths' functions are known)."""
    return bool(changes.symbols) or bool(layout and not layout.identical)


def cover(changes: Changes, counts: dict[str, Counts], layout: Layout | None,
          table: Table | None, checked: set[str], seconds: float = 0.0,
          uncounted: list[str] | None = None) -> Coverage:
    """Each changed function's reach over the profiles' base `counts`,
    suggestions from `table` for those no path ran (leaving out the
    `checked` profiles as they are), and `layout` with the paths' functions;
    `uncounted`: the profiles whose base could not be counted (a boot that
    failed), where a function may have run unseen."""
    ran = {s for windows, _ in counts.values() for w in windows.values()
           for s, n in w.items() if n > 0}
    resized = set(layout.resized) if layout else set()
    out = []
    for c in changes.functions:
        symbols = changes.symbols.get(c.function, [])
        reached = [Reached(profile, window, sum(w.get(s, 0.0) for s in symbols), units[window])
                   for profile, (windows, units) in counts.items()
                   for window, w in windows.items() if any(w.get(s, 0.0) > 0 for s in symbols)]
        names = [function_of(s) for s in symbols] or [c.function]
        suggested = table.reaching(names, checked) if table and not reached and symbols else []
        out.append(FunctionCoverage(c, symbols, changes.hosts.get(c.function, []),
                                    changes.why.get(c.function, ""), reached, suggested,
                                    bool(resized & set(symbols)) if layout else None))
    if layout:
        layout = Layout(layout.resized, layout.moved, layout.same, len(ran),
                        len(ran & set(layout.moved)), sorted(ran & resized))
    return Coverage(out, changes.parser, list(counts), layout, table.kernel if table else "",
                    seconds, list(uncounted or []))


def compare(base: Path, patched: Path) -> Layout | None:
    """The two kernels' text symbols compared (gzipped System.maps), or
    None where one has none."""
    a, b = _sized(base), _sized(patched)
    if a is None or b is None:
        return None
    both = a.keys() & b.keys()
    resized = sorted((a.keys() ^ b.keys()) | {n for n in both if a[n][1] != b[n][1]})
    moved = sorted(n for n in both if a[n][1] == b[n][1] and a[n][0] != b[n][0])
    return Layout(resized, moved, len(both) - len(moved) - len(set(resized) & both))


def _sized(symbols: Path) -> dict[str, tuple[int, int]] | None:
    """name -> (offset from _text, size to the next symbol) of each text
    symbol; a name given twice (static functions of several files) is
    left out, as its place says nothing."""
    if not symbols.is_file():
        return None
    pairs = sorted(text_symbols(symbols))
    text = next((addr for addr, name in pairs if name == "_text"), None)
    if text is None:
        return None
    seen: dict[str, int] = {}
    for _, name in pairs:
        seen[name] = seen.get(name, 0) + 1
    return {name: (addr - text, pairs[i + 1][0] - addr)
            for i, (addr, name) in enumerate(pairs[:-1]) if seen[name] == 1}
