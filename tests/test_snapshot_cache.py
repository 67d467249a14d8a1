"""The saved-boot cache shared by several mmlab processes: a prune never
removes a snapshot another process holds, prunes running at once never
fail on a snapshot the other removed, and a snapshot that vanished before
its restore is made again once.  Fake snapshot directories, no QEMU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mmlab.targets import boot, initramfs, snapcache, snapshot


def fake_snapshots(root: Path, names: list[str]) -> None:
    """Saved snapshots as prune sees them: an initrd and a state, the first
    name the most recently used."""
    for age, name in enumerate(names):
        d = root / name
        d.mkdir(parents=True)
        (d / "initrd").write_bytes(b"i" * 100)
        (d / "state.zst").write_bytes(b"s" * 900)
        os.utime(d / "state.zst", (1e9 - age, 1e9 - age))


def test_a_prune_never_removes_a_snapshot_another_process_holds(tmp_path, monkeypatch):
    """Another process holds the least recently used snapshot (looked up
    for a trial, not restored yet): a prune keeping nothing removes every
    other one and leaves that one whole."""
    fake_snapshots(tmp_path, ["a", "b", "held"])
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from pathlib import Path; from mmlab.targets import snapcache\n"
         f"with snapcache.in_use(Path({str(tmp_path / 'held')!r})):\n"
         "    print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout and holder.stdout.readline() == "held\n"
        monkeypatch.setattr(snapcache, "KEEP_BYTES", 0)
        snapcache.prune(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["held"]
        assert sorted(p.name for p in (tmp_path / "held").iterdir()) == ["initrd", "state.zst"]
    finally:
        holder.communicate("")
    assert holder.returncode == 0
    snapcache.prune(tmp_path)                   # released: now it goes too
    assert list(tmp_path.iterdir()) == []


def test_prunes_at_once_never_fail_on_a_snapshot_the_other_removed(tmp_path, monkeypatch):
    """Two processes prune one cache of 300 snapshots at the same moment,
    five times: each one's listing names snapshots the other is removing,
    and neither fails (before prunes took turns, a stat of a snapshot the
    other had just removed raised FileNotFoundError)."""
    cache = tmp_path / "cache"
    other = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from pathlib import Path; from mmlab.targets import snapcache\n"
         "snapcache.KEEP_BYTES = 0\n"
         "for _ in sys.stdin:\n"
         f"    snapcache.prune(Path({str(cache)!r})); print('done', flush=True)"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert other.stdin and other.stdout
    monkeypatch.setattr(snapcache, "KEEP_BYTES", 0)
    try:
        for r in range(5):
            fake_snapshots(cache, [f"{r}-{n}" for n in range(300)])
            other.stdin.write("prune\n")
            other.stdin.flush()
            snapcache.prune(cache)
            assert other.stdout.readline() == "done\n"
    finally:
        other.communicate("", timeout=60)
    assert other.returncode == 0
    assert list(cache.iterdir()) == []


def test_a_snapshot_that_vanished_before_its_restore_is_made_again_once(tmp_path,
                                                                        monkeypatch):
    """Removed between its lookup and its restore (by a process that does not
    lock it): the restore says so before starting QEMU, the snapshot is made
    again, and the trial counts one retry; vanishing twice boots instead."""
    saves, restores = [], []

    def save(guest, accel, snap, swap):
        saves.append(snap.dir)
        snap.state.write_bytes(b"state")
    monkeypatch.setattr(snapshot, "_key", lambda *a: "k")
    monkeypatch.setattr(snapshot, "trial_parts", lambda *a: [])
    monkeypatch.setattr(initramfs, "base_archive", lambda cache: tmp_path / "base.cpio")
    monkeypatch.setattr(initramfs, "trial_initrd", lambda base, s, out, parts: out.touch())
    monkeypatch.setattr(snapshot, "_save_retrying", save)
    real_restore = snapshot.restore

    def restore(guest, snap, *args):
        restores.append(snap.state.exists())
        if len(restores) == 1:
            shutil.rmtree(snap.dir)             # vanished after its lookup
            return real_restore(guest, snap, *args)
        return boot.BootResult({}, "", 0.1, start="restored")
    monkeypatch.setattr(snapshot, "restore", restore)
    guest = SimpleNamespace(state=0)
    got, retry = snapshot.restored(guest, "true", "tcg", tmp_path / "initramfs", None, (), None)
    assert got.start == "restored" and retry == 1
    assert len(saves) == 2 and restores == [True, True]

    monkeypatch.setattr(snapshot, "restore", lambda guest, snap, *a: real_restore(
        guest, snapshot.Snapshot(tmp_path / "gone"), *a))
    with pytest.raises(snapshot.SnapshotUnavailable, match="vanished before its restore"):
        snapshot.restored(guest, "true", "tcg", tmp_path / "initramfs", None, (), None)


def test_a_restore_is_a_use_that_keeps_its_snapshot_from_the_prune(tmp_path, monkeypatch):
    """Most recently used means restored: the restore touches its state, so
    a snapshot saved long ago but restored now outlives one saved since."""
    fake_snapshots(tmp_path, ["saved-since", "restored-now"])

    def no_qemu(*a):
        raise RuntimeError("no QEMU in this test")
    monkeypatch.setattr(snapshot, "start_qemu", no_qemu)
    monkeypatch.setattr(snapshot, "qemu_argv", lambda *a: [])
    with pytest.raises(RuntimeError, match="no QEMU"):
        snapshot.restore(SimpleNamespace(vcpus=1), snapshot.Snapshot(tmp_path / "restored-now"),
                         "true", "tcg", None)
    monkeypatch.setattr(snapcache, "KEEP_BYTES", 1000)
    snapcache.prune(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["restored-now"]
