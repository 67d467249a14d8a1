"""The saved-boot cache (snapshot.py's snapshots, one directory each):
which are in use, and which are pruned.

Several mmlab processes share the cache (an experiment, and a test run
beside it).  A process holds a shared lock on a snapshot's directory from
its lookup until its restore ends (`in_use`), and a prune removes only the
snapshots it can lock alone, so it never removes one another process is
about to restore; prunes take turns (the cache directory's lock), and one that finds a
snapshot gone meanwhile passes over it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

# Snapshots kept: the most recently used, up to this many bytes (about 40 MB
# each for a 1 GiB guest, so some 1,000): every guest of a suite over every
# release (the seeds suite's ~190, the broad suite's), three saved boots each
# where it counts, stays between runs, as its kernels do, and a suite's
# confirmations find their cells' guests saved.
KEEP_BYTES = 40 << 30


@contextmanager
def in_use(snap_dir: Path) -> Iterator[None]:
    """Hold a shared lock on the snapshot's directory: a prune removes only
    the directories it can lock alone (prune).  A directory a prune
    removed between our open and our lock is no longer the one at the
    path: then the lock is taken again, on the directory made anew."""
    while True:
        snap_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(snap_dir, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            continue
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            if os.stat(snap_dir).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        os.close(fd)


def prune(root: Path) -> None:
    """Keep the most recently used snapshots (their state's mtime, set by
    every restore) that fit in KEEP_BYTES, one prune at a time (each holds
    the cache directory's lock): a snapshot another process holds is kept
    (in_use), and one that vanished meanwhile is no longer there to count."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        used = 0
        for _, size, snap in sorted(filter(None, map(_usage, root.iterdir())), reverse=True):
            used += size
            if used > KEEP_BYTES:
                _remove(snap)
    finally:
        os.close(fd)


def _usage(snap: Path) -> tuple[float, int, Path] | None:
    """A saved snapshot's last use and size; None when it is no snapshot
    (a file, or one still being saved) or it vanished while being read."""
    try:
        used = (snap / "state.zst").stat().st_mtime
        return used, sum(f.stat().st_size for f in snap.iterdir() if f.is_file()), snap
    except (FileNotFoundError, NotADirectoryError):
        return None


def _remove(snap: Path) -> None:
    """Remove a snapshot no process holds (in_use): one that is held, or
    gone already, is left as it is."""
    try:
        fd = os.open(snap, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        shutil.rmtree(snap, ignore_errors=True)
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
