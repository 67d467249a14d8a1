"""How mmlab spells things: an axis value as arm names write it, and a label
made safe as a file or directory name (kernel cache entries, flame graphs,
reproducers).  Low in the stack so that every layer can use the one spelling."""

from __future__ import annotations

import re


def axis_text(value: object) -> str:
    """An axis value as arm names and baselines spell it: true, 2, hugepage."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def safe_name(name: str) -> str:
    """A name usable as a file name anywhere: runs of other characters -> '_'."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", name)
