"""Tables that keep every column at any width.  A rich Table wider than its
console is squeezed column by column, down to nothing: at 80 columns (a
split terminal, or `mmlab compare 1 | cat` read on one) the "arm vs
baseline" column of a comparison vanished and its rows could not be told
apart.  `Fitted` prints the table where its columns fit side by side, and
otherwise the same cells as records: each row's key (its label) on a line
of its own, whole, and the other columns beneath it, aligned under one
header, folded onto as many lines as the width needs."""

from __future__ import annotations

from collections.abc import Iterator

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

INDENT = "  "           # a record's columns, under its key
GAP = "  "              # between two columns
UNBOUNDED = 100_000     # a width no table reaches: measures its natural width


class Fitted:
    """A table, or its records where it would not fit (see the module)."""

    def __init__(self, table: Table, key: int = 1) -> None:
        self.table = table
        self.key = key                  # the leading columns that name a row

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        natural = Measurement.get(console, options.update_width(UNBOUNDED), self.table).maximum
        if natural <= options.max_width:
            yield self.table
        else:
            yield from records(console, self.table, self.key, options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.table)


def records(console: Console, table: Table, key: int, width: int) -> Iterator[Text]:
    """The title, a header (the key columns' names, then the others') over a
    rule, and per row its key cells on one line and its other cells on the
    lines below, each column as wide as its widest cell, so they align."""
    cols = [[_text(console, c) for c in column.cells] for column in table.columns]
    heads = [_text(console, column.header) for column in table.columns]
    rest = range(key, len(cols))
    widths = {i: max(t.cell_len for t in (heads[i], *cols[i])) for i in rest}
    lines = _lines(widths, width - len(INDENT))
    justify = [column.justify for column in table.columns]
    if table.title:
        yield _text(console, table.title)
    header = [Text(GAP).join(heads[:key])] + [
        _row([heads[i] for i in line], [widths[i] for i in line], [justify[i] for i in line])
        for line in lines]
    for text in header:
        yield _styled(text, "bold")
    yield Text("─" * min(width, max(t.cell_len for t in header)))
    for r, row in enumerate(table.rows):
        yield _styled(Text(GAP).join(cols[i][r] for i in range(key)), row.style)
        for line in lines:
            yield _styled(_row([cols[i][r] for i in line], [widths[i] for i in line],
                               [justify[i] for i in line]), row.style)
    if table.caption:
        yield _text(console, table.caption)


def _text(console: Console, cell: object) -> Text:
    """A cell as one line of text: markup read, line breaks made spaces."""
    text = cell.copy() if isinstance(cell, Text) else console.render_str(str(cell))
    return Text(" ").join(text.split("\n", allow_blank=True))


def _lines(widths: dict[int, int], room: int) -> list[list[int]]:
    """The columns in order, as many to a line as fit in `room`."""
    lines: list[list[int]] = [[]]
    used = 0
    for i, w in widths.items():
        if lines[-1] and used + len(GAP) + w > room:
            lines.append([])
            used = 0
        used += (len(GAP) if lines[-1] else 0) + w
        lines[-1].append(i)
    return [line for line in lines if line]


def _row(cells: list[Text], widths: list[int], justify: list) -> Text:
    """One line of a record: each cell padded to its column's width."""
    out = Text(INDENT)
    for n, (cell, w, how) in enumerate(zip(cells, widths, justify)):
        cell = cell.copy()
        cell.align("right" if how == "right" else "left", w)
        out.append_text(Text(GAP) if n else Text())
        out.append_text(cell)
    out.rstrip()
    return out


def _styled(text: Text, style) -> Text:
    if style:
        text.stylize(style)
    return text
