"""Global kernel settings an arm changes, and putting them back.

Every change is preceded by a journal entry on disk (fsync'd) holding what
was there before, so the old state can be restored after each trial, at
exit, after Ctrl-C, and after a crash: the next `mmlab` start finds a
journal whose owner process is gone and replays it.  Nothing here changes a
setting unless the caller was allowed to (`host_changes = true` in a profile
or `--allow-host-changes`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .errors import MmlabError

THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
THP_DEFRAG = "/sys/kernel/mm/transparent_hugepage/defrag"
KSM_DIR = "/sys/kernel/mm/ksm"
THP_MODES = ("always", "madvise", "never")
THP_DEFRAG_MODES = ("always", "defer", "defer+madvise", "madvise", "never")
SWAP_SPEC = re.compile(r"^(none|file:\d+[KMG]|zram:\d+[KMG])$")


def state_dir() -> Path:
    """Where the journal and swap files live (MMLAB_STATE_DIR overrides)."""
    env = os.environ.get("MMLAB_STATE_DIR")
    if env:
        return Path(env)
    return Path("/var/lib/mmlab") if os.geteuid() == 0 else Path.home() / ".local/state/mmlab"


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
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode:
        raise MmlabError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.returncode}")


def active_swaps() -> list[tuple[str, int]]:
    """(path, priority) of every active swap area, from /proc/swaps."""
    lines = Path("/proc/swaps").read_text().splitlines()[1:]
    return [(f[0], int(f[4])) for f in (ln.split() for ln in lines) if len(f) >= 5]


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
        self.path = path or state_dir() / "journal.json"

    def _load(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"pid": os.getpid(), "entries": []}
        except json.JSONDecodeError as exc:
            raise MmlabError(f"{self.path}: unreadable journal ({exc}); fix or remove it") from exc

    def _save(self, data: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def entries(self) -> list[dict]:
        return self._load()["entries"]

    def _append(self, entry: dict) -> None:
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
        """Remember a swap area turned off ("swapon") or one mmlab added
        ("swapfile", "zram"), before doing it."""
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
    def session(self) -> Iterator["Journal"]:
        """Restore what was recorded inside the block when it ends, however it
        ends; what an enclosing session recorded stays for that one."""
        keep = len(self.entries())
        try:
            yield self
        finally:
            self.restore(keep)


def _undo(e: dict) -> str:
    kind = e["kind"]
    if kind == "file":
        if read_setting(e["path"]) == e["old"]:
            return ""
        _write(e["path"], e["old"])
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
    raise MmlabError(f"journal entry of unknown kind {kind!r}")


def parse_size(text: str) -> int:
    """'512M' -> bytes."""
    m = re.fullmatch(r"(\d+)([KMG])", text)
    if not m:
        raise MmlabError(f"size {text!r}: expected a number and K, M or G")
    return int(m.group(1)) << {"K": 10, "M": 20, "G": 30}[m.group(2)]


@dataclass
class HostSettings:
    """The global settings one arm asks for; None means 'leave as it is'."""

    thp: str | None = None
    thp_defrag: str | None = None
    swap: str | None = None                  # none | file:SIZE | zram:SIZE
    ksm: dict[str, int] = field(default_factory=dict)
    sysctl: dict[str, str] = field(default_factory=dict)

    def changes(self) -> list[str]:
        """The settings that differ from the running system, in words."""
        out = []
        for path, want in self.files():
            have = read_setting(path) if Path(path).exists() else "absent"
            if have != want:
                out.append(f"{path}: {have} -> {want}")
        if self.swap is not None:
            have = ", ".join(p for p, _ in active_swaps()) or "none"
            if not (self.swap == "none" and have == "none"):
                out.append(f"swap: {have} -> {self.swap}")
        return out

    def files(self) -> list[tuple[str, str]]:
        """(setting file, wanted value) pairs; swap is handled apart."""
        files = []
        if self.thp:
            files.append((THP_ENABLED, self.thp))
        if self.thp_defrag:
            files.append((THP_DEFRAG, self.thp_defrag))
        files += [(f"{KSM_DIR}/{k}", str(v)) for k, v in self.ksm.items()]
        files += [("/proc/sys/" + k.replace(".", "/"), str(v)) for k, v in self.sysctl.items()]
        return files


def apply(settings: HostSettings, journal: Journal, allowed: bool) -> list[str]:
    """Put the host in `settings`, journaling first; refuse unless allowed."""
    changes = settings.changes()
    if changes and not allowed:
        raise MmlabError(f"would change {changes[0]}; set host_changes = true in the "
                         "profile or pass --allow-host-changes")
    for path, want in settings.files():
        if not Path(path).exists():
            raise MmlabError(f"{path}: not on this kernel")
        journal.record_file(path)
        if read_setting(path) != want:
            _write(path, want)
    if settings.swap is not None:
        _apply_swap(settings.swap, journal)
    return changes


def _apply_swap(spec: str, journal: Journal) -> None:
    kind, _, size = spec.partition(":")
    for path, prio in active_swaps():
        journal.record("swapon", path=path, priority=prio)
        _run("swapoff", path)
    if kind == "file":
        path = state_dir() / "swapfile"
        journal.record("swapfile", path=str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            # Written, not fallocated: swapon rejects files with unwritten extents
            # on some filesystems.
            chunk = b"\0" * (1 << 20)
            for _ in range(parse_size(size) >> 20):
                f.write(chunk)
        _run("mkswap", "-q", str(path))
        _run("swapon", str(path))
    elif kind == "zram":
        dev = _free_zram()
        journal.record("zram", device=dev)
        _write(f"/sys/block/{Path(dev).name}/disksize", str(parse_size(size)))
        _run("mkswap", "-q", dev)
        _run("swapon", "-p", "100", dev)


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
