"""Locate and (re)build the `mmwork` binary the workloads run in (and
`mmcensus`, the census's BPF iterator, built by the same Makefile).

mmlab runs from a source checkout (`pip install -e .`), so the C sources sit
next to the package; the binary is rebuilt whenever a source is newer.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.machine import paths

REPO_ROOT = Path(__file__).resolve().parents[3]
WORKLOAD_SRC = REPO_ROOT / "workloads"
BUILD_DIR = REPO_ROOT / "build"


def _stale(binary: Path) -> bool:
    if not binary.exists():
        return True
    built = binary.stat().st_mtime
    return any(src.stat().st_mtime > built for src in WORKLOAD_SRC.rglob("*"))


def mmwork_path() -> Path:
    """The path of an up-to-date mmwork, building it first when needed.

    MMLAB_MMWORK names a prebuilt binary instead (e.g. one built for a guest).
    """
    override = os.environ.get("MMLAB_MMWORK")
    if override:
        path = Path(override)
        if not path.is_file():
            raise MmlabError(f"MMLAB_MMWORK={override}: no such file")
        return path
    return built("mmwork")


def built(name: str) -> Path:
    """build/NAME, made by `make -C workloads` first when a source is newer."""
    binary = BUILD_DIR / name
    if not _stale(binary):
        return binary
    with paths.filling(BUILD_DIR / "workloads"):   # one make at a time; the Makefile
        if _stale(binary):                          # renames each binary into place
            if not (WORKLOAD_SRC / "Makefile").exists():
                raise MmlabError(f"{WORKLOAD_SRC}: workload sources not found")
            proc = subprocess.run(["make", "-s", "-C", str(WORKLOAD_SRC)],
                                  capture_output=True, text=True)
            if proc.returncode:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
                raise MmlabError(f"building {name} failed: {tail[0]}")
    return binary
