"""The journal: old values are on disk before a change, restored in reverse
order, per session, and replayed after a crash.  Uses plain files standing in
for sysfs so that no global setting is touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mmlab.errors import MmlabError
from mmlab.machine import journal_trust, knobs


@pytest.fixture(autouse=True)
def managed(tmp_path, monkeypatch):
    """The scratch files stand for settings mmlab manages (journal_trust)."""
    monkeypatch.setattr(journal_trust, "SETTINGS", (*journal_trust.SETTINGS, f"{tmp_path}/**"))


@pytest.fixture
def setting(tmp_path):
    path = tmp_path / "enabled"
    path.write_text("always [madvise] never\n")
    return path


def test_mode_files_read_back_as_the_selected_word(setting):
    assert knobs.read_setting(str(setting)) == "madvise"


def test_old_value_is_on_disk_before_the_change(tmp_path, setting):
    journal = knobs.Journal(tmp_path / "journal.json")
    journal.record_file(str(setting))
    on_disk = json.loads((tmp_path / "journal.json").read_text())
    assert on_disk["entries"] == [{"kind": "file", "path": str(setting), "old": "madvise"}]


def test_sessions_restore_only_their_own_changes(tmp_path, setting):
    other = tmp_path / "pages_to_scan"
    other.write_text("100\n")
    journal = knobs.Journal(tmp_path / "journal.json")
    with journal.session():
        journal.record_file(str(setting))
        setting.write_text("never")
        with journal.session():
            journal.record_file(str(other))
            other.write_text("5000")
        assert other.read_text() == "100"          # inner session undone
        assert setting.read_text() == "never"      # outer change still in force
    assert setting.read_text() == "madvise"
    assert not journal.path.exists()


def test_restore_runs_when_the_block_raises(tmp_path, setting):
    journal = knobs.Journal(tmp_path / "journal.json")
    with pytest.raises(RuntimeError), journal.session():
        journal.record_file(str(setting))
        setting.write_text("always")
        raise RuntimeError("trial crashed")
    assert setting.read_text() == "madvise"


def test_a_crashed_owner_is_replayed_a_live_one_is_not(tmp_path, setting):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = tmp_path / "journal.json"
    journal_trust.write(path, {"pid": dead.pid, "entries": [
        {"kind": "file", "path": str(setting), "old": "never"}]})
    journal = knobs.Journal(path)
    assert journal.orphaned()
    assert knobs.replay_orphaned(journal) == [f"{setting} = never"]
    assert setting.read_text() == "never" and not path.exists()

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        journal_trust.write(path, {"pid": live.pid, "entries": []})
        assert not knobs.Journal(path).orphaned()
    finally:
        live.kill()


def test_changes_are_refused_without_consent(monkeypatch, tmp_path, setting):
    monkeypatch.setattr(knobs, "THP_ENABLED", str(setting))
    wanted = knobs.HostSettings(thp="always")
    with pytest.raises(MmlabError, match=r"would change .*madvise -> always.*host_changes"):
        knobs.apply(wanted, knobs.Journal(tmp_path / "j.json"), allowed=False)
    assert setting.read_text().startswith("always [madvise]")
    assert knobs.apply(knobs.HostSettings(thp="madvise"), knobs.Journal(tmp_path / "j.json"),
                       allowed=False) == []   # asking for what is there needs no consent


def test_bad_sizes_and_journals_name_the_culprit(tmp_path):
    with pytest.raises(MmlabError, match="size '12X'"):
        knobs.parse_size("12X")
    assert knobs.parse_size("512M") == 512 << 20
    bad = tmp_path / "journal.json"
    bad.write_text("{not json")
    with pytest.raises(MmlabError, match="journal.json: unreadable journal"):
        knobs.Journal(bad).entries()


def test_a_second_process_waits_for_the_machine_lock(tmp_path, monkeypatch):
    """Settings are global: a second mmlab's session starts only when the
    first one's ends, and says whom it waits for."""
    monkeypatch.setenv("MMLAB_LOCK", str(tmp_path / "machine.lock"))
    code = ("from mmlab.machine import knobs\n"
            "with knobs.machine_lock():\n"
            "    print('got it', flush=True)\n")
    with knobs.machine_lock(), knobs.machine_lock():      # re-entrant in one process
        other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        # However long the other takes to start on a busy machine, it says it
        # waits while this one holds the lock, and has not gone on.
        assert other.stderr is not None
        said = other.stderr.readline()
        assert other.poll() is None
    out, _ = other.communicate(timeout=30)
    assert out == "got it\n"
    assert f"waiting for mmlab pid {os.getpid()}" in said


def test_two_processes_filling_one_cache_entry_take_turns(tmp_path, monkeypatch):
    """A kernel asked for by two mmlab processes at once is fetched once:
    the second waits for the first's lock and finds it made (two fetches
    into one cache once failed with "Directory not empty")."""
    import threading
    from types import SimpleNamespace

    from mmlab.kernels import images
    from mmlab.machine import paths
    fetched, inside = [], threading.Event()
    release = threading.Event()

    def add_debian(spec, cache=None, apt=None):
        fetched.append(spec)
        inside.set()
        release.wait(5)
        (tmp_path / "made").write_text(spec)
        return spec

    def get(name, cache=None):
        if (tmp_path / "made").exists():
            return SimpleNamespace(name=name, format=images.FORMAT)
        raise MmlabError("not cached")
    monkeypatch.setattr(images, "add_debian", add_debian)
    monkeypatch.setattr(images, "get", get)
    monkeypatch.setattr(images, "cache_dir", lambda: tmp_path)
    first = threading.Thread(target=images.ensure, args=("debian:6.12",))
    first.start()
    inside.wait(5)
    second = threading.Thread(target=images.ensure, args=("debian:6.12",))
    second.start()
    release.set()
    first.join(5)
    second.join(5)
    assert fetched == ["6.12"]
    with paths.filling(tmp_path / "x"):
        assert (tmp_path / "x.lock").exists()
