"""Where mmlab keeps what it fetches and builds on this machine: kernels, its
own apt lists, kernel sources and builds, guest images, compiled C sources."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """~/.cache/mmlab, or the folder holding MMLAB_KERNEL_CACHE when that is
    set (the tests give every cache a private home that way)."""
    env = os.environ.get("MMLAB_KERNEL_CACHE")
    return Path(env).parent if env else Path.home() / ".cache/mmlab"
