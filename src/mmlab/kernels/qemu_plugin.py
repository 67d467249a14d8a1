"""mmlab's QEMU TCG plugin (workloads/qemu-plugin/insns.c), built for the
QEMU installed here.

A plugin must be compiled against the plugin header of the QEMU that loads
it, and Debian ships no header package for it.  So the header comes from
Debian's own source package of the installed QEMU: `apt-get source
--download-only qemu=VERSION` through mmlab's apt (catalog.Apt, whose deb-src
lines include bookworm, the suite that carries the host's qemu; the host's
sources are never touched), unpacked with dpkg-source so Debian's patches
apply, and only `include/qemu/qemu-plugin.h` kept.  The plugin is then built
with gcc and glib and cached by QEMU version and by the hash of what went
into it.  Where any step fails (no mirror, no such source version, no
compiler) the reason is an MmlabError: the caller runs without counts.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.kernels import catalog
from mmlab.machine import paths, proc
from mmlab.names import safe_name
from mmlab.workloads import csource
from mmlab.workloads.build import WORKLOAD_SRC

PACKAGE = "qemu-system-x86"
SOURCE = WORKLOAD_SRC / "qemu-plugin" / "insns.c"
HEADER = "include/qemu/qemu-plugin.h"


def cache_dir() -> Path:
    return paths.cache_root() / "qemu-plugin"


def file_arg(name: str, text: str) -> str:
    """The plugin argument NAME=PATH for a file holding `text` (the kernel's
    stays or calls), kept in the plugin's cache by what it holds: made once,
    whole (written aside, then renamed), and shared by every later run."""
    path = cache_dir() / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text)
        tmp.rename(path)
    return f"{name}={path}"


def source_version() -> str:
    """The Debian source version of the installed QEMU (1:7.2+dfsg-7+deb12u18)."""
    out = proc.call(["dpkg-query", "-W", "-f", "${source:Version}", PACKAGE], check=False)
    if out.returncode or not out.stdout.strip():
        raise MmlabError(f"{PACKAGE} is not installed (make setup installs it)")
    return out.stdout.strip()


def _dir(version: str) -> Path:
    return cache_dir() / safe_name(version)


def header(version: str, fetch: bool = True) -> Path:
    """qemu-plugin.h of Debian's qemu `version`, fetched once and kept."""
    kept = _dir(version) / "qemu-plugin.h"
    if kept.exists() or not fetch:
        return kept
    apt = catalog.Apt()
    apt.refresh()
    with tempfile.TemporaryDirectory(prefix="mmlab-qemu-src-") as tmp:
        work = Path(tmp)
        apt.call("apt-get", "source", "--download-only", f"qemu={version}", cwd=work,
                 what=f"apt-get source qemu={version} (the plugin header)")
        dsc = next(work.glob("qemu_*.dsc"), None)
        if dsc is None:
            raise MmlabError(f"apt-get source qemu={version} fetched no .dsc")
        proc.call(["dpkg-source", "--no-check", "-x", dsc.name, "src"], cwd=work, timeout=600,
                  what="dpkg-source -x (qemu)")
        kept.parent.mkdir(parents=True, exist_ok=True)
        tmp_header = kept.with_suffix(f".tmp{os.getpid()}")
        shutil.copyfile(work / "src" / HEADER, tmp_header)
        tmp_header.rename(kept)
    return kept


def _key(version: str, hdr: Path) -> str:
    """What the .so is built from: the QEMU version, its header, our sources
    (insns.c and the headers beside it that it includes)."""
    h = hashlib.sha256(version.encode())
    for f in (hdr, SOURCE, *sorted(SOURCE.parent.glob("*.h")), WORKLOAD_SRC / "core-insns.h",
              csource.HEADER):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _built(version: str, hdr: Path) -> Path:
    return _dir(version) / f"insns-{_key(version, hdr)}.so"


def build(so: Path) -> str:
    """Which build of the plugin `so` is, as each sample it counted records
    it (insns.PLUGIN_KEY): its name, made of the QEMU version and the hash
    of its sources and header (`_key`), so any change to what it counts or
    how gives another, and the tracker never compares counts across two."""
    return so.stem


def _compile(hdr: Path, dest: Path) -> None:
    glib = proc.call(["pkg-config", "--cflags", "--libs", "glib-2.0"], check=False)
    if glib.returncode:
        raise MmlabError("glib's headers are missing (pkg-config glib-2.0): install "
                         "libglib2.0-dev (make setup does)")
    tmp = dest.with_suffix(f".tmp{os.getpid()}")
    proc.call(["gcc", "-shared", "-fPIC", "-O2", "-Wall", f"-I{hdr.parent}", SOURCE,
              *glib.stdout.split(), "-o", tmp], what="building the QEMU plugin")
    tmp.rename(dest)


def ensure() -> Path:
    """The plugin for the installed QEMU, fetched and built when needed."""
    version = source_version()
    hdr = header(version)
    so = _built(version, hdr)
    if not so.exists():
        with paths.filling(so):
            if not so.exists():
                _compile(hdr, so)
    return so


def status() -> tuple[bool, str]:
    """(usable now, in words) without fetching anything: for the probe."""
    try:
        version = source_version()
    except MmlabError as exc:
        return False, str(exc)
    hdr = header(version, fetch=False)
    if not hdr.exists():
        return False, (f"not built yet: mmlab fetches Debian's qemu {version} source for its "
                       "header on the first guest run that counts instructions")
    try:
        so = _built(version, hdr)
        if not so.exists():
            _compile(hdr, so)
    except MmlabError as exc:
        return False, str(exc)
    return True, f"{so} (qemu {version})"
