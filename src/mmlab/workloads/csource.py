"""A reporter's single-file C reproducer, compiled by mmlab (`source = "repro.c"`).

It is built statically (`gcc -O2 -static`), so the same binary runs on the
host and, packed alone into the initramfs, in any guest.  It finds mmlab's
header for marking its own windows as #include "mmlab.h" (`mmlab header`
prints it, for a program built by hand).  Binaries are cached
by the SHA-256 of the source, the compiler's version and the flags: a
changed file is rebuilt, an unchanged one never is, and a stored experiment
that carries the source text rebuilds the very same program on resume.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.machine import paths, proc
from mmlab.names import safe_name
from mmlab.workloads.build import WORKLOAD_SRC

CC = "gcc"
CFLAGS = ("-O2", "-static", "-pthread")
LIBS = ("-lm",)
HEADER = WORKLOAD_SRC / "include" / "mmlab.h"     # the program's windows (insns.py)


def cache_dir() -> Path:
    return paths.cache_root() / "sources"


@cache
def compiler() -> str:
    """The compiler's identity, part of the cache key."""
    return proc.call([CC, "--version"], what=f"{CC} --version").stdout.splitlines()[0]


def key(text: str) -> str:
    """What a binary is cached under: the source, the compiler and the flags."""
    h = hashlib.sha256()
    for part in (text, compiler(), " ".join(CFLAGS + LIBS), HEADER.read_text()):
        h.update(part.encode() + b"\0")
    return h.hexdigest()


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def binary(text: str, name: str, cache: Path | None = None) -> Path:
    """The static binary of C source `text` (`name`: the file it came from,
    for the binary's name and for errors), compiled on first use."""
    stem = safe_name(Path(name).stem) or "repro"
    dest = (cache or cache_dir()) / key(text)[:16] / stem
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    src = dest.parent / f"{stem}.c"
    src.write_text(text)
    tmp = dest.with_name(f"{stem}.tmp{os.getpid()}")
    built = proc.call([CC, *CFLAGS, f"-I{HEADER.parent}", "-o", tmp, src, *LIBS],
                      what=f"{CC} {name}", check=False)
    if built.returncode:
        first = next((line for line in built.stderr.splitlines() if "error" in line),
                     proc.last_words(built, 1))
        raise MmlabError(f"{name}: does not compile with {CC} {' '.join(CFLAGS)}: "
                         f"{first.replace(str(src), name)}")
    tmp.rename(dest)
    return dest
