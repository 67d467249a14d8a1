"""Where mmlab keeps what it fetches and builds on this machine (kernels, its
own apt lists, kernel sources and builds, guest images, compiled C sources)
and what it must find again after a crash (the settings journal, swap
files).  Nothing here imports more than the standard library and
mmlab.errors: every command's start asks for the journal.

A folder the environment names is checked where it is read, before anything
is made in it: a file, a device or a folder of the kernel's own filesystems
(/proc, /sys, /dev) is refused, naming the variable."""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mmlab.errors import MmlabError

# Filesystems the kernel makes for itself: nothing of mmlab's can be kept there.
KERNEL_FS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "tracefs",
                       "debugfs", "securityfs", "bpf", "configfs", "pstore", "efivarfs",
                       "mqueue", "fusectl", "binfmt_misc"})
# The file in the kernel cache that holds its identity (a kernel's folder starts with its kind).
CACHE_ID = ".identity"


def kernel_cache() -> Path:
    """Where fetched and built kernels are kept: ~/.cache/mmlab/kernels, or
    MMLAB_KERNEL_CACHE (the tests give every cache a private home that way)."""
    return env_dir("MMLAB_KERNEL_CACHE") or Path.home() / ".cache/mmlab/kernels"


def kernel_cache_id(make: bool = True) -> str | None:
    """The kernel cache's identity: a random token in its folder, made once
    by the first mmlab that asks (`make`) and read by every other, here or
    on a host that mounts the same folder.  A fleet's worker registers it,
    so that `mmlab check` knows which workers can boot the kernels it builds
    into its cache.  The token is written under a name of its own and
    hard-linked into place, which only one of two makers at once wins (NFS
    too), so both read the winner's and no reader sees half a token.  None
    when the cache has none and `make` is false."""
    cache = kernel_cache()
    path = cache / CACHE_ID
    if make and not path.exists():
        _link_new_id(cache, path)
    try:
        text = path.read_text(errors="replace").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise MmlabError(f"{path}: cannot read the kernel cache's identity: "
                         f"{exc.strerror}") from None
    if not re.fullmatch(r"[0-9a-f]{32}", text):
        raise MmlabError(f"{path}: not a kernel cache's identity (32 hex digits); remove it "
                         "and mmlab makes another")
    return text


def _link_new_id(cache: Path, path: Path) -> None:
    """A new token linked in as `path`, unless another's is there first."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=cache, prefix=".new-id-") as out:
            os.fchmod(out.fileno(), 0o644)  # no secret: every host's workers read it, as whoever
            out.write(secrets.token_hex(16) + "\n")
            out.flush()
            os.link(out.name, path)
    except FileExistsError:
        pass
    except OSError as exc:
        raise MmlabError(f"{path}: cannot make the kernel cache's identity: "
                         f"{exc.strerror}") from None


def cache_root() -> Path:
    """~/.cache/mmlab: the folder holding the kernel cache, and mmlab's apt
    lists, sources and builds beside it."""
    return kernel_cache().parent


def state_dir() -> Path:
    """Where the journal and swap files live (MMLAB_STATE_DIR overrides)."""
    env = env_dir("MMLAB_STATE_DIR")
    if env:
        return env
    return Path("/var/lib/mmlab") if os.geteuid() == 0 else Path.home() / ".local/state/mmlab"


def env_dir(name: str) -> Path | None:
    """$`name` as a folder mmlab may keep its files in, None when unset or
    empty.  It must be a folder, or one that can be made: its nearest
    existing parent a folder outside the kernel's own filesystems.  So
    MMLAB_STATE_DIR=/proc/version or MMLAB_KERNEL_CACHE=/dev/null is refused
    in one line before a store, a lock or a cache entry is made."""
    text = os.environ.get(name)
    if not text:
        return None
    _may_hold(name, text, Path(text))
    return Path(text)


def env_file(name: str) -> Path | None:
    """$`name` as a file mmlab makes and locks (MMLAB_LOCK), None when unset
    or empty: a regular file, or one that can be made, in a folder
    `env_dir` would take (so not /proc/version, nor /dev/null)."""
    text = os.environ.get(name)
    if not text:
        return None
    path = Path(text)
    if path.exists() and not path.is_file():
        raise MmlabError(f"{name}={text}: not a regular file")
    _may_hold(name, text, path.parent)
    return path


def _may_hold(name: str, text: str, path: Path) -> None:
    """Refuse `path` (from $`name` = `text`) unless it is, or can become, a
    folder outside the kernel's own filesystems."""
    if not text.isprintable():
        raise MmlabError(f"{name}={text!r}: expected a path of printable characters")
    there = path
    while not there.exists() and there != there.parent:
        there = there.parent
    if not there.is_dir():
        raise MmlabError(f"{name}={text}: {there} is not a directory, so this cannot be one")
    fstype = mount_of(there)[1]
    if fstype in KERNEL_FS:
        raise MmlabError(f"{name}={text}: {there} is in the kernel's own {fstype} filesystem, "
                         "where mmlab cannot keep its files")


def mount_of(path: Path) -> tuple[str, str, str]:
    """(mount point, filesystem type, source) of the mount that holds
    `path` (symlinks resolved): the last mounted at the longest matching point."""
    real = os.path.realpath(path)
    found = ("/", "?", "?")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), left.split()[4])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(found[0]):
            fstype, source = (right.split() + ["?", "?"])[:2]
            found = (point, fstype, source)
    return found


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
