"""Numbers mmlab reads from its environment variables (docs/cli.md lists
them), checked where they are read: a value that is no number is bad input,
one line naming the variable and the value, never a traceback."""

from __future__ import annotations

import math
import os

from mmlab.errors import MmlabError


def seconds(name: str, default: float) -> float:
    """$`name` as a number of seconds, `default` when it is unset."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise MmlabError(f"{name}={text!r}: expected a number of seconds, e.g. {default:g}")
    return value
