"""Numbers and URLs mmlab reads from its environment variables (docs/cli.md
lists them), checked where they are read: a value that is no number, or no
plain URL, is bad input, one line naming the variable and the value, never
a traceback, and refused before anything is written with it.  Folders named
by the environment are checked in machine/paths.py, which knows mounts."""

from __future__ import annotations

import math
import os
import re

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


# http(s)://host[:port][/path]: letters, digits and . _ ~ % + - / only, so a
# value reaches a file another program parses (apt's sources.list) as one word.
URL = re.compile(r"https?://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?"
                 r"(/[A-Za-z0-9._~%+/-]*)?")


def url(name: str) -> str | None:
    """$`name` as an http(s) URL of plain characters, None when it is unset
    or empty: a mirror written into apt's sources.list must not split into
    other words there, nor carry a shell's syntax."""
    text = os.environ.get(name)
    if not text:
        return None
    if not URL.fullmatch(text):
        raise MmlabError(f"{name}={text!r}: expected an http:// or https:// URL of plain "
                         "characters, e.g. http://deb.debian.org/debian")
    return text
