"""A standalone reproducer: one C file for one workload, with an experiment's
parameters as its defaults, that builds with `gcc -O2 file.c` alone and prints
the same JSON samples as mmwork.  A maintainer can check a claim with it
without installing mmlab."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.workloads import Workload
from mmlab.workloads.build import WORKLOAD_SRC

# A local include: the file it names is concatenated instead.
_LOCAL_INCLUDE = re.compile(r'\s*#\s*include\s+"([^"]+)"\s*')


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def harness() -> list[Path]:
    """The harness files in concatenation order, from workloads/harness.list
    (the list the Makefile builds from): '#' starts a comment, names are
    separated by white space."""
    text = (WORKLOAD_SRC / "harness.list").read_text()
    return [WORKLOAD_SRC / name for line in text.splitlines()
            for name in line.split("#", 1)[0].split()]


def source(wl: Workload, params: Mapping[str, object], title: str) -> str:
    """The single-file C source for `wl` with `params` as default arguments."""
    pieces = harness()
    workload_file = next(f for f in sorted(WORKLOAD_SRC.glob("*.c"))
                         if f not in pieces and f'.name = "{wl.name}"' in f.read_text())
    args = wl.args(params)
    defaults = " ".join(_c_string(a) + "," for a in args)
    found = re.search(r"const struct mm_workload (wl_\w+) = \{", workload_file.read_text())
    if found is None:
        raise MmlabError(f"{workload_file}: no `const struct mm_workload` in it")
    symbol = found.group(1)
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
    ]
    done: set[str] = set()
    for path in [*pieces, workload_file]:
        parts.append(_strip(path, done))
        done.add(path.name)
    return "\n".join(parts)


def _strip(path: Path, done: set[str]) -> str:
    """`path` without what the concatenation already has: _GNU_SOURCE and the
    local includes, each of which must name a file placed before it."""
    lines = []
    for line in path.read_text().splitlines():
        if line.strip() == "#define _GNU_SOURCE":
            continue
        include = _LOCAL_INCLUDE.fullmatch(line)
        if include:
            if Path(include[1]).name not in done:
                raise MmlabError(f"{path.name} includes {include[1]}, which "
                                 "workloads/harness.list does not put before it")
            continue
        lines.append(line)
    return "\n".join(lines)
