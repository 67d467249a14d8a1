"""How mmlab spells things: an axis value as arm names write it, a label
made safe as a file or directory name (kernel cache entries, flame graphs,
reproducers), and text a user gave shown on one line of a terminal.  Low in
the stack so that every layer can use the one spelling."""

from __future__ import annotations

import re


def axis_text(value: object) -> str:
    """An axis value as arm names and baselines spell it: true, 2, hugepage."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def safe_name(name: str) -> str:
    """A name usable as a file name anywhere: runs of other characters -> '_'."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", name)


def shown(text: str) -> str:
    """`text` as one line a terminal shows as it is: a character Python's
    repr escapes (a control or format character: BEL rings, ESC starts a
    terminal sequence, RLO U+202E reverses what follows, a newline splits a
    one-line error) is written as repr writes it, without the quotes."""
    return text if text.isprintable() else repr(text)[1:-1]


def hidden_character(text: str) -> str | None:
    """The first character of `text` a terminal would not show as itself,
    as U+XXXX (None if there is none): what a name must not hold."""
    return next((f"U+{ord(c):04X}" for c in text if not c.isprintable()), None)
