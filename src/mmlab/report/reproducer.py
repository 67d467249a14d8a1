"""A standalone reproducer: one C file for one workload, with an experiment's
parameters as its defaults, that builds with `gcc -O2 file.c` alone and prints
the same JSON samples as mmwork.  A maintainer can check a claim with it
without installing mmlab."""

from __future__ import annotations

import re
import shlex

from ..build import WORKLOAD_SRC
from ..workloads import Workload


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def source(wl: Workload, params: dict[str, object], title: str) -> str:
    """The single-file C source for `wl` with `params` as default arguments."""
    files = {p.name: p for p in WORKLOAD_SRC.glob("*.c")}
    workload_file = next(f for f in files.values()
                         if f'.name = "{wl.name}"' in f.read_text())
    args = wl.args(params)
    defaults = " ".join(_c_string(a) + "," for a in args)
    symbol = re.search(r"const struct mm_workload (wl_\w+) = \{", workload_file.read_text()).group(1)
    header = (WORKLOAD_SRC / "common.h").read_text()
    parts = [
        f"/*\n * mmlab reproducer: {title}\n"
        f" * workload {wl.name} ({wl.seed})\n"
        f" * defaults: {' '.join(shlex.quote(a) for a in args)}\n"
        " * build: gcc -O2 -o repro repro.c   (as root for settings the workload changes)\n"
        " * run:   ./repro --samples 5        (arguments override the defaults)\n"
        " * prints one JSON object per sample on stdout.\n */",
        "#define _GNU_SOURCE",
        f"#define MMWORK_SINGLE {symbol}",
        f"#define MMWORK_DEFAULT_ARGS {defaults}",
        '#define MMWORK_VERSION "reproducer"',
        header,
        _strip(workload_file.read_text()),
        _strip((WORKLOAD_SRC / "common.c").read_text()),
    ]
    return "\n".join(parts)


def _strip(text: str) -> str:
    """Drop what the concatenation already has: the local include and _GNU_SOURCE."""
    return "\n".join(line for line in text.splitlines()
                     if line.strip() not in ('#include "common.h"', "#define _GNU_SOURCE"))
