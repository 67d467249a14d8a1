"""mmlab replays its settings journal as root, so the journal is trusted
only when this mmlab wrote it and names only the settings mmlab changes.  A
crafted journal, one aimed through `..` or a symlink, and one that others
may write put nothing back: the command says so in one line naming the
journal, exits non-zero, and the scratch file it aimed at keeps its
content.  Every target here is a scratch file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mmlab.errors import MmlabError
from mmlab.machine import journal_trust, knobs
from mmlab.workloads import mmwork

from .conftest import is_root

ISSUE = {"version": 1, "entries": [{"kind": "file", "path": "VICTIM", "old": "overwritten\n"}]}


@pytest.fixture
def state(tmp_path, monkeypatch) -> Path:
    """A private state folder and lock, as a fresh machine's."""
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("MMLAB_STATE_DIR", str(folder))
    monkeypatch.setenv("MMLAB_LOCK", str(tmp_path / "machine.lock"))
    return folder


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim"
    path.write_text("original\n")
    return path


@pytest.fixture
def settings(tmp_path, monkeypatch) -> Path:
    """A scratch folder mmlab manages as if it were sysfs, with one setting."""
    folder = tmp_path / "settings"
    folder.mkdir()
    (folder / "enabled").write_text("always [madvise] never\n")
    monkeypatch.setattr(journal_trust, "SETTINGS", (*journal_trust.SETTINGS, f"{folder}/**"))
    return folder


def mmlab(*args: str, managed: Path | None = None) -> subprocess.CompletedProcess:
    """The mmlab command in a process of its own; `managed` a scratch folder
    it treats as settings, as the `settings` fixture does in this one."""
    code = "import sys\nfrom mmlab.machine import journal_trust\n"
    if managed:
        code += f"journal_trust.SETTINGS += ({f'{managed}/**'!r},)\n"
    code += "from mmlab.cli import main\nmain()\n"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120)


def dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def sealed(journal: Path, *entries: dict) -> None:
    """A journal sealed with mmlab's own key, as if mmlab had been made to
    journal these entries."""
    journal_trust.write(journal, {"pid": dead_pid(), "entries": list(entries)})


def assert_refused(done: subprocess.CompletedProcess, journal: Path, victim: Path) -> None:
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and f"mmlab: {journal}: " in done.stderr, done.stderr
    assert "restored" not in done.stdout + done.stderr
    assert victim.read_text() == "original\n"
    assert journal.exists()                  # left for the user to read


def test_the_issues_crafted_journal_writes_nothing(state, victim, tmp_path):
    """The journal of the report, as written by hand: refused by `mmlab
    restore` and by any other command's start, even where its path were a
    setting mmlab manages."""
    journal = state / "journal.json"
    journal.write_text(json.dumps(ISSUE).replace("VICTIM", str(victim)))
    for command in (["restore"], ["header"]):
        done = mmlab(*command, managed=tmp_path)
        assert_refused(done, journal, victim)
        assert "no seal" in done.stderr and "then remove it" in done.stderr


@pytest.mark.parametrize("aim", ["outside", "dotdot", "symlink"])
def test_a_sealed_journal_puts_back_only_settings_mmlab_changes(state, victim, settings, aim):
    """Even a journal with mmlab's seal writes only a managed setting, `..`
    and symlinks resolved, and refuses the whole journal before any entry."""
    link = settings / "enabled-link"
    link.symlink_to(victim)
    path = {"outside": str(victim), "dotdot": f"{settings}/../victim", "symlink": str(link)}[aim]
    journal = state / "journal.json"
    sealed(journal, {"kind": "file", "path": str(settings / "enabled"), "old": "never"},
           {"kind": "file", "path": path, "old": "overwritten"})
    done = mmlab("restore", managed=settings)
    assert_refused(done, journal, victim)
    assert "entry 2 " in done.stderr and f"{victim} is not a setting mmlab changes" in done.stderr
    assert (settings / "enabled").read_text() == "always [madvise] never\n"   # entry 1 neither


def test_a_journal_others_may_write_is_refused(state, victim, settings):
    """A journal mmlab wrote, then made writable by others (or its folder),
    or edited after mmlab sealed it."""
    journal = state / "journal.json"
    setting = settings / "enabled"
    sealed(journal, {"kind": "file", "path": str(setting), "old": "never"})
    for mode, folder_mode in ((0o666, 0o700), (0o600, 0o777)):
        journal.chmod(mode)
        state.chmod(folder_mode)
        done = mmlab("restore", managed=settings)
        assert_refused(done, journal, victim)
        assert "may be written by others" in done.stderr
        assert setting.read_text() == "always [madvise] never\n"
    state.chmod(0o700)
    journal.chmod(0o600)
    journal.write_text(journal.read_text().replace(str(setting), str(victim)))
    done = mmlab("restore", managed=settings)
    assert_refused(done, journal, victim)
    assert "seal does not match" in done.stderr


@pytest.mark.skipif(not is_root(), reason="needs root to give the journal away")
def test_a_journal_of_another_user_is_refused(state, victim, settings):
    journal = state / "journal.json"
    sealed(journal, {"kind": "file", "path": str(victim), "old": "overwritten"})
    os.chown(journal, 65534, 65534)
    done = mmlab("restore", managed=settings)
    assert_refused(done, journal, victim)
    assert "belongs to uid 65534" in done.stderr


def test_kinds_and_values_mmlab_does_not_write_are_refused(state, settings):
    setting = str(settings / "enabled")
    bad = [{"kind": "exec", "path": setting},
           {"kind": "file", "path": setting, "old": "never\nrm -rf /"},
           {"kind": "file", "path": setting, "old": "x" * 5000},
           {"kind": "file", "path": setting, "old": "never", "mode": "0777"},
           {"kind": "swapfile", "path": str(settings / "enabled")},
           {"kind": "zram", "device": "/dev/sda"},
           {"kind": "swapon", "path": setting, "priority": 1},
           {"kind": "mount", "path": str(settings)}]
    for entry in bad:
        assert journal_trust.fault(entry), entry
    area = settings / "swap-area"                  # a scratch file, never turned on
    area.write_bytes(b"\0" * (1 << 20))
    subprocess.run(["mkswap", "-q", str(area)], check=True)
    ok = [{"kind": "file", "path": setting, "old": "4\t4\t1\t7"},
          {"kind": "swapon", "path": str(area), "priority": -2},
          {"kind": "swapfile", "path": str(state / "swapfile")},
          {"kind": "zram", "device": "/dev/zram0"},
          {"kind": "mount", "path": knobs.TRACEFS}]
    assert [journal_trust.fault(e) for e in ok] == [None] * len(ok)


def test_nothing_mmlab_would_not_undo_is_journaled_or_changed(state, victim):
    """A workload declaring a file mmlab does not manage is refused before
    it runs, and every workload mmwork offers declares only managed ones."""
    workload = SimpleNamespace(host_settings=(str(victim),))
    with pytest.raises(MmlabError, match=f"{victim} is not a setting mmlab changes"), \
            mmwork._guard_workload_settings(workload, knobs.Journal()):
        pass
    assert not (state / "journal.json").exists() and victim.read_text() == "original\n"
    from mmlab import workloads
    declared = [p for w in workloads.registry().values() for p in w.host_settings
                if p.startswith("/") and " " not in p]
    assert declared and all(journal_trust.managed(p) for p in declared), declared


def test_a_crashed_runs_settings_are_still_put_back(state, settings):
    """What a killed mmlab journaled is put back by the next one."""
    setting = settings / "enabled"
    crash = ("import os\nfrom mmlab.machine import journal_trust, knobs\n"
             f"journal_trust.SETTINGS += ({f'{settings}/**'!r},)\n"
             f"knobs.SettingFile({str(setting)!r}).apply('never', knobs.Journal())\n"
             "os._exit(9)\n")
    died = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True)
    assert died.returncode == 9, died.stderr
    assert setting.read_text() == "never"
    done = mmlab("restore", managed=settings)
    assert done.returncode == 0, done.stderr
    assert f"restored: {setting} = madvise" in done.stderr
    assert setting.read_text() == "madvise" and not (state / "journal.json").exists()
    assert (state / "journal.key").stat().st_mode & 0o777 == 0o600
