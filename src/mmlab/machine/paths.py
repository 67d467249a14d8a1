"""Where mmlab keeps what it fetches and builds on this machine (kernels, its
own apt lists, kernel sources and builds, guest images, compiled C sources)
and what it must find again after a crash (the settings journal, swap
files).  Nothing here imports more than the standard library: every
command's start asks for the journal."""

from __future__ import annotations

import os
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


def journal_path() -> Path:
    """The settings journal: present only while, or after, a run changed a
    global setting it has not yet put back."""
    return state_dir() / "journal.json"
