"""Whether a settings journal may be replayed.  mmlab puts back, as root,
what its journal lists, so a journal that anyone else could have written
would let them write any file on the machine.  A journal is therefore read
only when this mmlab wrote it and it names only what mmlab changes; if not,
it is refused whole, naming the file and the entry, before anything is put
back.

Written by this mmlab: the journal and its folder belong to this user and
no one else may write them, and the journal carries an HMAC made with a key
of mmlab's own (`journal.key` beside it, mode 0600, made on first use).

Names only what mmlab changes: a setting file is one of SETTINGS or a CPU
clock file cpufreq writes, symlinks and `..` resolved, and its old value is
one printable line; a swap file is the state folder's own `swapfile`; a
zram device is /dev/zramN; a swap area turned back on carries mkswap's
signature; the one mount is tracefs.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import stat
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

from mmlab.errors import MmlabError
from mmlab.machine import cpufreq
from mmlab.machine.paths import state_dir

THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
THP_DEFRAG = "/sys/kernel/mm/transparent_hugepage/defrag"
KSM_DIR = "/sys/kernel/mm/ksm"
DAMON_KDAMONDS = "/sys/kernel/mm/damon/admin/kdamonds"
DAMON_MODULES = "/sys/module/damon_*/parameters/enabled"
TRACEFS = "/sys/kernel/tracing"

# The setting files a journal may write back, as patterns over resolved paths:
# `*` stays within one folder, a final `**` is anything below.  A workload's
# declared host settings are among them (KSM's files, vm.nr_hugepages); the
# tests add a scratch folder of their own.
SETTINGS: tuple[str, ...] = (THP_ENABLED, THP_DEFRAG, f"{KSM_DIR}/*", "/proc/sys/**",
                             DAMON_MODULES, f"{DAMON_KDAMONDS}/*/state")

VERSION = 2
KEY = "journal.key"
MAX_VALUE = 4096                # a sysctl is written in one page at most
ZRAM = re.compile(r"/dev/zram\d{1,4}")
FIELDS = {"file": {"path", "old"}, "swapfile": {"path"}, "zram": {"device"},
          "swapon": {"path", "priority"}, "mount": {"path"}}


class UntrustedJournal(MmlabError):
    """A journal this mmlab did not write, or one naming what it does not change."""


def _refuse(journal: Path, why: str) -> UntrustedJournal:
    return UntrustedJournal(f"{journal}: {why}; mmlab puts back nothing from it: read it, put "
                            "back by hand what it lists, then remove it")


def _foreign(st: os.stat_result, what: str, others: int) -> str | None:
    """Why a file or folder with this stat is not this user's alone, or None."""
    if st.st_uid != os.geteuid():
        return f"{what} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    if st.st_mode & others:
        return f"{what} may be written by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _read_private(path: Path, journal: Path, what: str, others: int) -> bytes:
    """A regular file's bytes, once it is this user's alone (not through a
    symlink); refusing `journal` otherwise."""
    st = path.lstat()
    why = (f"{what} is not a regular file" if not stat.S_ISREG(st.st_mode)
           else _foreign(st, what, others))
    if why:
        raise _refuse(journal, why)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _make_key(path: Path) -> None:
    """A new random key, in place whole or not at all (two mmlab processes may race)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(32))
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
    except FileExistsError:
        pass                    # another mmlab made it first: that one is the key
    finally:
        tmp.unlink(missing_ok=True)


def _key(journal: Path) -> bytes:
    path = journal.with_name(KEY)
    if not path.exists():
        raise _refuse(journal, f"mmlab's key is not beside it ({path.name})")
    key = _read_private(path, journal, f"its key {path.name}", 0o077)
    if len(key) != 32:
        raise _refuse(journal, f"{path.name} is not a key mmlab made")
    return key


def seal(data: dict, key: bytes) -> str:
    """The HMAC of everything in `data` but the seal itself."""
    body = json.dumps({k: v for k, v in data.items() if k != "mac"}, sort_keys=True,
                      separators=(",", ":"))
    return hmac.new(key, body.encode(), "sha256").hexdigest()


def read(journal: Path) -> dict | None:
    """The journal's content once it proves this mmlab wrote it and every
    entry is one mmlab would undo; None when there is no journal."""
    if not journal.exists() and not journal.is_symlink():
        return None
    why = _foreign(journal.parent.stat(), "its folder", 0o022)
    if why:
        raise _refuse(journal, why)
    text = _read_private(journal, journal, "it", 0o022)
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _refuse(journal, f"unreadable journal ({exc})") from exc
    if not isinstance(data, dict) or "mac" not in data:
        raise _refuse(journal, "it carries no seal of this mmlab's (an older mmlab or "
                               "someone else wrote it)")
    if not hmac.compare_digest(str(data["mac"]), seal(data, _key(journal))):
        raise _refuse(journal, "its seal does not match mmlab's key (it was changed after "
                               "mmlab wrote it)")
    if set(data) != {"version", "pid", "entries", "mac"} or data["version"] != VERSION \
            or type(data["pid"]) is not int or not isinstance(data["entries"], list):
        raise _refuse(journal, f"not a journal of this mmlab's (version {VERSION})")
    for n, entry in enumerate(data["entries"], 1):
        _check(entry, journal, n)
    return data


def write(journal: Path, data: dict) -> None:
    """Seal `data` with mmlab's key and put it in place whole (fsync'd, then
    renamed), in a folder no one else may write."""
    folder = journal.parent
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    why = _foreign(folder.stat(), "its folder", 0o022)
    if why:
        raise MmlabError(f"{journal}: {why}; mmlab keeps its settings journal only where no "
                         f"one else can write it")
    if not journal.with_name(KEY).exists():
        _make_key(journal.with_name(KEY))
    sealed = {**data, "version": VERSION}
    sealed["mac"] = seal(sealed, _key(journal))
    tmp = journal.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        json.dump(sealed, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, journal)


def _check(entry: object, journal: Path, n: int) -> None:
    """Refuse entry `n` unless it is one mmlab writes and would undo."""
    why = fault(entry)
    if why:
        shown = json.dumps(entry)
        shown = shown if len(shown) <= 160 else shown[:157] + "..."
        raise _refuse(journal, f"entry {n} {shown}: {why}")


def fault(entry: object) -> str | None:
    """Why mmlab would not undo `entry`, or None when it would."""
    if not isinstance(entry, dict) or entry.get("kind") not in FIELDS:
        return "not a kind of change mmlab makes"
    kind = entry["kind"]
    if set(entry) != FIELDS[kind] | {"kind"}:
        return f"not the fields mmlab writes for {kind}"
    texts = [v for k, v in entry.items() if k != "priority"]
    if not all(isinstance(v, str) and _one_line(v) for v in texts):
        return "a value that is not one printable line"
    return _KINDS[kind](entry)


def _one_line(value: str) -> bool:
    return len(value) <= MAX_VALUE and all(c.isprintable() or c == "\t" for c in value)


def resolved(path: str) -> str:
    """`path` with symlinks and `..` resolved: where a write to it lands."""
    return os.path.realpath(path)


def managed(path: str) -> bool:
    """Whether `path` (absolute), resolved, is a setting file mmlab changes."""
    if not os.path.isabs(path):
        return False
    where = PurePosixPath(resolved(path)).parts
    return any(_matches(where, PurePosixPath(p).parts) for p in SETTINGS + _clock_files())


def _matches(where: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    if pattern[-1] == "**":
        pattern = pattern[:-1]
        if len(where) <= len(pattern):
            return False
    elif len(where) != len(pattern):
        return False
    return all(fnmatchcase(part, want) for part, want in zip(where, pattern))


def _clock_files() -> tuple[str, ...]:
    """The CPU clock files cpufreq writes, where it reads them now (a CPU's
    cpufreq folder is often a symlink to its policy's)."""
    cpu = cpufreq.CPU
    return (f"{cpu}/cpu[0-9]*/cpufreq/scaling_governor",
            f"{cpu}/cpufreq/policy[0-9]*/scaling_governor",
            *(f"{cpu}/{name}" for name, _ in cpufreq.Turbo.SWITCHES))


def _swap_area(path: str) -> bool:
    """Whether `path` is a block device or file carrying mkswap's signature
    (SWAPSPACE2 at the end of its first page): swapon would otherwise
    rewrite, for one, a hibernation image's header."""
    try:
        mode = os.stat(path).st_mode
        if not (stat.S_ISBLK(mode) or stat.S_ISREG(mode)):
            return False
        with open(path, "rb") as f:
            f.seek(os.sysconf("SC_PAGE_SIZE") - 10)
            return f.read(10) == b"SWAPSPACE2"
    except OSError:
        return False


def _file(entry: dict) -> str | None:
    if managed(entry["path"]):
        return None
    return f"{resolved(entry['path'])} is not a setting mmlab changes"


def _swapfile(entry: dict) -> str | None:
    path = entry["path"]
    own = state_dir() / "swapfile"
    if os.path.isabs(path) and Path(resolved(os.path.dirname(path)), os.path.basename(path)) \
            == Path(resolved(str(own.parent)), own.name):
        return None
    return f"mmlab's only swap file is {own}"


def _zram(entry: dict) -> str | None:
    return None if ZRAM.fullmatch(entry["device"]) else "not a zram device (/dev/zramN)"


def _swapon(entry: dict) -> str | None:
    prio = entry["priority"]
    if type(prio) is not int or not -32768 <= prio <= 32767:
        return "not a swap priority"
    if not os.path.isabs(entry["path"]) or not _swap_area(entry["path"]):
        return f"{entry['path']} is not a swap area"
    return None


def _mount(entry: dict) -> str | None:
    return None if resolved(entry["path"]) == TRACEFS else f"mmlab mounts only {TRACEFS}"


_KINDS = {"file": _file, "swapfile": _swapfile, "zram": _zram, "swapon": _swapon,
          "mount": _mount}
