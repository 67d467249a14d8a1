"""Global kernel settings an arm changes, and putting them back.

Every change is preceded by a journal entry on disk (fsync'd) holding what
was there before, so the old state can be restored after each trial, at
exit, after Ctrl-C, and after a crash: the next `mmlab` start finds a
journal whose owner process is gone and replays it.  Nothing here changes a
setting unless the caller was allowed to (`host_changes = true` in a profile
or `--allow-host-changes`).  A journal is read and written through
journal_trust: one this mmlab did not write, or one naming anything but the
settings it changes, is refused whole.
"""

from __future__ import annotations

import fcntl
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, StrictInt

from mmlab.errors import MmlabError
from mmlab.machine import cpufreq, journal_trust, proc
from mmlab.machine.journal_trust import (
    DAMON_KDAMONDS,
    DAMON_MODULES,
    KSM_DIR,
    THP_DEFRAG,
    THP_ENABLED,
    TRACEFS,
)
from mmlab.machine.paths import env_file, journal_path, state_dir

SWAP_SPEC = re.compile(r"^(none|file:\d+[KMG]|zram:\d+[KMG])$")
TRACEFS_CANDIDATES = (TRACEFS, "/sys/kernel/debug/tracing")


def read_setting(path: str) -> str:
    """A sysfs/procfs value; for mode files ("a [b] c") the selected word."""
    text = Path(path).read_text().strip()
    m = re.search(r"\[([^\]]+)\]", text)
    return m.group(1) if m else text


def _write(path: str, value: str) -> None:
    try:
        Path(path).write_text(value)
    except OSError as exc:
        raise MmlabError(f"cannot write {value!r} to {path}: {exc.strerror}") from exc


def _run(*argv: str) -> None:
    proc.call(list(argv), what=" ".join(argv))


def active_swaps() -> list[tuple[str, int]]:
    """(path, priority) of every active swap area, from /proc/swaps."""
    lines = Path("/proc/swaps").read_text().splitlines()[1:]
    return [(f[0], int(f[4])) for f in (ln.split() for ln in lines) if len(f) >= 5]


def mounted(path: str) -> bool:
    """Whether a filesystem is mounted at `path` (from /proc/mounts)."""
    return any(line.split()[1] == path for line in Path("/proc/mounts").read_text().splitlines())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Journal:
    """What mmlab changed, in order, with the values to put back."""

    def __init__(self, path: Path | None = None):
        self.path = path or journal_path()

    def _load(self) -> dict:
        """The journal, once journal_trust finds this mmlab wrote it."""
        return journal_trust.read(self.path) or {"pid": os.getpid(), "entries": []}

    def _save(self, data: dict) -> None:
        journal_trust.write(self.path, data)

    def entries(self) -> list[dict]:
        return self._load()["entries"]

    def _append(self, entry: dict) -> None:
        """Journal `entry`, refused first if mmlab could not undo it (a
        workload declaring a file mmlab does not manage is refused here,
        before anything changes)."""
        why = journal_trust.fault(entry)
        if why:
            raise MmlabError(f"refused before any change: {why}")
        data = self._load()
        data["pid"] = os.getpid()
        data["entries"].append(entry)
        self._save(data)

    def record_file(self, path: str) -> None:
        """Remember a setting file's value (once) before it is changed."""
        if not Path(path).exists():
            return
        if any(e["kind"] == "file" and e["path"] == path for e in self.entries()):
            return  # the oldest recorded value is the one to go back to
        self._append({"kind": "file", "path": path, "old": read_setting(path)})

    def record(self, kind: str, **fields: object) -> None:
        """Remember a swap area turned off ("swapon"), one mmlab added
        ("swapfile", "zram") or a filesystem it mounted ("mount"), before
        doing it."""
        self._append({"kind": kind, **fields})

    def restore(self, keep: int = 0) -> list[str]:
        """Undo the entries after the first `keep`, newest first; returns what
        was done, in words.  The journal is removed when nothing is left."""
        data = self._load()
        done, failures = [], []
        for e in reversed(data["entries"][keep:]):
            try:
                done.append(_undo(e))
            except (MmlabError, OSError) as exc:
                failures.append(f"{e}: {exc}")
        if failures:
            raise MmlabError("could not restore: " + "; ".join(failures))
        data["entries"] = data["entries"][:keep]
        if data["entries"]:
            self._save(data)
        else:
            self.path.unlink(missing_ok=True)
        return [d for d in done if d]

    def orphaned(self) -> bool:
        """True when a journal exists and the process that wrote it is gone."""
        if not self.path.exists():
            return False
        pid = self._load().get("pid", 0)
        return pid != os.getpid() and not _pid_alive(pid)

    @contextmanager
    def session(self) -> Iterator[Journal]:
        """Restore what was recorded inside the block when it ends, however it
        ends; what an enclosing session recorded stays for that one.  The
        block holds the machine lock: settings are global, so two mmlab
        processes on one machine change them (and time trials) in turn."""
        with machine_lock():
            keep = len(self.entries())
            try:
                yield self
            finally:
                self.restore(keep)


def lock_path() -> Path:
    """The machine-wide lock file (MMLAB_LOCK overrides): one per machine,
    not per state dir, because THP, KSM and swap are one per machine."""
    env = env_file("MMLAB_LOCK")
    if env:
        return env
    return Path("/run/lock/mmlab.lock") if os.geteuid() == 0 else state_dir() / "machine.lock"


_lock_depth = 0
_said_wait = False      # this process has said it waits for the lock


@contextmanager
def machine_lock() -> Iterator[None]:
    """Hold the machine lock for the block (re-entrant within a process);
    says once on stderr who it waits for."""
    global _lock_depth, _said_wait
    if _lock_depth:
        _lock_depth += 1
        try:
            yield
        finally:
            _lock_depth -= 1
        return
    path = lock_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            if not _said_wait:          # once a run, not once a trial
                print(f"mmlab: waiting for mmlab pid {holder}: host trials and setting "
                      f"changes take turns on this machine ({path})", file=sys.stderr)
            _said_wait = True
            fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        _lock_depth = 1
        try:
            yield
        finally:
            _lock_depth = 0
            fcntl.flock(f, fcntl.LOCK_UN)


def _undo(e: dict) -> str:
    kind = e["kind"]
    if kind == "file":
        target = journal_trust.resolved(e["path"])     # the file journal_trust accepted
        if read_setting(target) == e["old"]:
            return ""
        _write(target, e["old"])
        return f"{e['path']} = {e['old']}"
    if kind == "swapfile":
        if any(p == e["path"] for p, _ in active_swaps()):
            _run("swapoff", e["path"])
        Path(e["path"]).unlink(missing_ok=True)
        return f"removed swap file {e['path']}"
    if kind == "zram":
        if any(p == e["device"] for p, _ in active_swaps()):
            _run("swapoff", e["device"])
        _write(f"/sys/block/{Path(e['device']).name}/reset", "1")
        return f"reset {e['device']}"
    if kind == "swapon":
        if not any(p == e["path"] for p, _ in active_swaps()):
            _run("swapon", "-p", str(e["priority"]), e["path"])
        return f"swapon {e['path']}"
    if kind == "mount":
        if mounted(e["path"]):
            _run("umount", e["path"])
        return f"unmounted {e['path']}"
    raise MmlabError(f"journal entry of unknown kind {kind!r}")


def parse_size(text: str) -> int:
    """'512M' -> bytes."""
    m = re.fullmatch(r"(\d+)([KMG])", text)
    if not m:
        raise MmlabError(f"size {text!r}: expected a number and K, M or G")
    return int(m.group(1)) << {"K": 10, "M": 20, "G": 30}[m.group(2)]


class SettingFile:
    """A sysfs or procfs value file: read the value in force, apply a wanted one
    (the old value journaled first), restored by the journal's "file" entry."""

    def __init__(self, path: str):
        self.path = path

    def read(self) -> str:
        return read_setting(self.path) if Path(self.path).exists() else "absent"

    def apply(self, value: str, journal: Journal) -> None:
        if not Path(self.path).exists():
            raise MmlabError(f"{self.path}: not on this kernel")
        journal.record_file(self.path)
        if read_setting(self.path) != value:
            _write(self.path, value)


class ThpEnabled(SettingFile):
    """transparent_hugepage/enabled: which anonymous mappings may get THPs."""

    def __init__(self):
        super().__init__(THP_ENABLED)


class ThpDefrag(SettingFile):
    """transparent_hugepage/defrag: how hard a THP fault tries to compact."""

    def __init__(self):
        super().__init__(THP_DEFRAG)


class KsmKnob(SettingFile):
    """One file under /sys/kernel/mm/ksm (run, pages_to_scan, max_page_sharing...)."""

    def __init__(self, name: str):
        super().__init__(f"{KSM_DIR}/{name}")


class Sysctl(SettingFile):
    """A sysctl by its dotted name (vm.swappiness -> /proc/sys/vm/swappiness)."""

    def __init__(self, name: str):
        super().__init__("/proc/sys/" + name.replace(".", "/"))


class DamonActors:
    """Every DAMON worker the kernel runs on its own: the DAMON modules
    (damon_stat, damon_reclaim, damon_lru_sort; Debian's 6.19 starts
    damon_stat at boot) and the running sysfs kdamonds.  Each samples access
    by clearing young bits, so an arm run beside one is not in the same page
    state as one run without.  "off" turns each one off, journaled as the
    file it writes, so restore turns it back on."""

    MODULES = DAMON_MODULES
    KDAMONDS = f"{DAMON_KDAMONDS}/*/state"
    ON = {"Y": "N", "on": "off"}      # running value -> stopped value

    def files(self) -> list[tuple[SettingFile, str]]:
        """(file, value that stops it) for each actor running here now."""
        out = []
        for pattern in (self.MODULES, self.KDAMONDS):
            for path in sorted(Path("/").glob(pattern.lstrip("/"))):
                value = read_setting(str(path))
                if value in self.ON:
                    out.append((SettingFile(str(path)), self.ON[value]))
        return out

    @classmethod
    def shell_off(cls) -> list[str]:
        """The same, as lines of the guest's /trial.sh (its actors are only
        known inside the guest)."""
        return [f"for f in {cls.MODULES}; do [ \"$(cat $f 2>/dev/null)\" = Y ] && echo N > $f; "
                "done; true",
                f"for f in {cls.KDAMONDS}; do [ \"$(cat $f 2>/dev/null)\" = on ] && "
                "echo off > $f; done; true"]


class Swap:
    """The swap areas in use: none, a swap file, or a zram device.  Applying
    turns every active area off first (journaled "swapon", turned back on at
    restore) and journals what it adds ("swapfile", "zram") before adding it."""

    def read(self) -> str:
        return ", ".join(p for p, _ in active_swaps()) or "none"

    def apply(self, spec: str, journal: Journal) -> None:
        kind, _, size = spec.partition(":")
        for path, prio in active_swaps():
            journal.record("swapon", path=path, priority=prio)
            _run("swapoff", path)
        if kind == "file":
            self._add_file(parse_size(size), journal)
        elif kind == "zram":
            self._add_zram(parse_size(size), journal)

    @staticmethod
    def _add_file(size: int, journal: Journal) -> None:
        path = state_dir() / "swapfile"
        journal.record("swapfile", path=str(path))
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(path, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            # Written, not fallocated: swapon rejects files with unwritten extents
            # on some filesystems.
            chunk = b"\0" * (1 << 20)
            for _ in range(size >> 20):
                f.write(chunk)
        _run("mkswap", "-q", str(path))
        _run("swapon", str(path))

    @staticmethod
    def _add_zram(size: int, journal: Journal) -> None:
        dev = _free_zram()
        journal.record("zram", device=dev)
        _write(f"/sys/block/{Path(dev).name}/disksize", str(size))
        _run("mkswap", "-q", dev)
        _run("swapon", "-p", "100", dev)


class Tracefs:
    """The tracing filesystem.  A fresh machine may not have it mounted;
    as root, mmlab mounts it for a collection pass (as perf does) and the
    journal unmounts it afterwards, like any other global change."""

    @staticmethod
    def find() -> Path | None:
        """Where tracefs is mounted now, or None."""
        return next((Path(c) for c in TRACEFS_CANDIDATES if Path(c, "events").is_dir()), None)

    def mount(self, journal: Journal) -> Path | None:
        """tracefs, mounted first if needed and possible (root); None if not."""
        found = self.find()
        if found or os.geteuid() != 0 or not Path(TRACEFS).is_dir():
            return found
        journal.record("mount", path=TRACEFS)
        _run("mount", "-t", "tracefs", "nodev", TRACEFS)
        return self.find()


ThpMode = Literal["always", "madvise", "never"]
ThpDefragMode = Literal["always", "defer", "defer+madvise", "madvise", "never"]


def _swap_spec(value: str) -> str:
    if not SWAP_SPEC.match(value):
        raise ValueError("expected none, file:SIZE or zram:SIZE (SIZE like 256M)")
    return value


SwapSpec = Annotated[str, AfterValidator(_swap_spec)]


class HostSettings(BaseModel):
    """The global settings one arm asks for; None means 'leave as it is'.
    Each field is validated here, so a profile's bad value is named by key."""
    model_config = ConfigDict(extra="forbid")

    thp: ThpMode | None = None
    thp_defrag: ThpDefragMode | None = None
    swap: SwapSpec | None = None              # none | file:SIZE | zram:SIZE
    ksm: dict[str, StrictInt] = {}
    sysctl: dict[str, str] = {}
    damon: Literal["off"] | None = None       # off: every DAMON actor stopped
    governor: cpufreq.GovernorName | None = None   # the CPU clock (cpufreq.py)
    turbo: cpufreq.TurboState | None = None

    def files(self) -> list[tuple[SettingFile, str]]:
        """(setting file, wanted value) pairs on this machine; swap is not a
        file and is apart."""
        out: list[tuple[SettingFile, str]] = self.fixed_files()
        if self.damon == "off":
            out += DamonActors().files()
        return out + self.clock_files()

    def clock(self) -> HostSettings | None:
        """The CPU clock settings alone, None when neither is set: what a
        guest arm sets on the host, whose CPUs run its vCPUs."""
        if self.governor is None and self.turbo is None:
            return None
        return HostSettings(governor=self.governor, turbo=self.turbo)

    def clock_files(self) -> list[tuple[SettingFile, str]]:
        """The CPU clock's files; MmlabError naming the key where this
        machine cannot set it (no cpufreq, a governor its CPUs lack)."""
        pairs = cpufreq.Governor().files(self.governor) if self.governor else []
        pairs += cpufreq.Turbo().files(self.turbo) if self.turbo else []
        return [(SettingFile(path), value) for path, value in pairs]

    def fixed_files(self) -> list[tuple[SettingFile, str]]:
        """The files whose path does not depend on the machine (a guest
        writes these as they are; it finds its DAMON actors itself)."""
        out: list[tuple[SettingFile, str]] = []
        if self.thp:
            out.append((ThpEnabled(), self.thp))
        if self.thp_defrag:
            out.append((ThpDefrag(), self.thp_defrag))
        out += [(KsmKnob(k), str(v)) for k, v in self.ksm.items()]
        out += [(Sysctl(k), v) for k, v in self.sysctl.items()]
        return out

    def changes(self) -> list[str]:
        """The settings that differ from the running system, in words."""
        out = [f"{knob.path}: {knob.read()} -> {want}" for knob, want in self.files()
               if knob.read() != want]
        if self.swap is not None:
            have = Swap().read()
            if not (self.swap == "none" and have == "none"):
                out.append(f"swap: {have} -> {self.swap}")
        return out


def apply(settings: HostSettings, journal: Journal, allowed: bool) -> list[str]:
    """Put the host in `settings`, journaling first; refuse unless allowed."""
    changes = settings.changes()
    if changes and not allowed:
        raise MmlabError(f"would change {changes[0]}; set host_changes = true in the "
                         "profile or pass --allow-host-changes")
    for knob, want in settings.files():
        knob.apply(want, journal)
    if settings.swap is not None:
        Swap().apply(settings.swap, journal)
    return changes


def _free_zram() -> str:
    for block in sorted(Path("/sys/block").glob("zram*")):
        if (block / "disksize").read_text().strip() == "0":
            return f"/dev/{block.name}"
    hot_add = Path("/sys/class/zram-control/hot_add")
    if hot_add.exists():
        return f"/dev/zram{hot_add.read_text().strip()}"
    raise MmlabError("swap = zram: no free zram device and no zram-control "
                     "(load the zram module)")


def replay_orphaned(journal: Journal | None = None) -> list[str]:
    """At start-up: restore what a crashed mmlab left changed, if anything."""
    journal = journal or Journal()
    if not journal.orphaned():
        return []
    return journal.restore() or ["(nothing had changed)"]
