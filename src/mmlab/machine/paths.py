"""Where mmlab keeps what it fetches and builds on this machine (kernels, its
own apt lists, kernel sources and builds, guest images, compiled C sources)
and what it must find again after a crash (the settings journal, swap
files).  Nothing here imports more than the standard library: every
command's start asks for the journal."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def cache_root() -> Path:
    """~/.cache/mmlab, or the folder holding MMLAB_KERNEL_CACHE when that is
    set (the tests give every cache a private home that way)."""
    env = os.environ.get("MMLAB_KERNEL_CACHE")
    return Path(env).parent if env else Path.home() / ".cache/mmlab"


def state_dir() -> Path:
    """Where the journal and swap files live (MMLAB_STATE_DIR overrides)."""
    env = os.environ.get("MMLAB_STATE_DIR")
    if env:
        return Path(env)
    return Path("/var/lib/mmlab") if os.geteuid() == 0 else Path.home() / ".local/state/mmlab"


@contextmanager
def filling(entry: Path) -> Iterator[None]:
    """Hold `entry`'s lock (ENTRY.lock beside it) while it is made: two
    mmlab processes filling one cache entry (a kernel, the mmwork build, the
    QEMU plugin, a snapshot) take turns, and the second finds it made.  The
    caller checks again inside the block whether it still needs making."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.with_name(entry.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def journal_path() -> Path:
    """The settings journal: present only while, or after, a run changed a
    global setting it has not yet put back."""
    return state_dir() / "journal.json"
