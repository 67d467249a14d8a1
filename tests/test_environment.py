"""What mmlab reads from its environment is checked where it is read, before
anything is written with it: a mirror is a plain http(s) URL, a folder is one
mmlab can keep files in.  And the Debian catalog's refresh either succeeds
whole or leaves the last good sources, lists and state as they were, with
a freshness check that reads what is on disk."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from mmlab import environ
from mmlab.errors import MmlabError
from mmlab.kernels import catalog
from mmlab.machine import paths

from .conftest import mmlab
from .test_bad_input import one_line

BAD_MIRRORS = ["not a url; $(id)", "http://deb.debian.org/debian main\ndeb http://x/",
               "ftp://deb.debian.org/debian", "http://deb.debian.org/debian [trusted=yes]",
               "deb.debian.org/debian"]


@pytest.mark.parametrize("mirror", BAD_MIRRORS)
def test_a_mirror_that_is_no_plain_url_is_refused_before_anything_is_written(tmp_path, mirror):
    home = tmp_path / "cache"
    proc = mmlab("kernels", "available", env={"MMLAB_KERNEL_CACHE": str(home / "kernels"),
                                              "MMLAB_APT_MIRROR": mirror})
    one_line(proc, "MMLAB_APT_MIRROR", repr(mirror))
    assert not home.exists()


@pytest.mark.parametrize("mirror", ["http://deb.debian.org/debian",
                                    "https://mirror.example.org:8443/debian/",
                                    "http://[::1]:3142/debian", "http://127.0.0.1:9/debian"])
def test_a_plain_mirror_is_taken_as_it_is(monkeypatch, mirror):
    monkeypatch.setenv("MMLAB_APT_MIRROR", mirror)
    assert environ.url("MMLAB_APT_MIRROR") == mirror
    assert catalog.mirrors()[0] == mirror.rstrip("/")


def unreachable_mirror() -> str:
    """A local port nobody listens on: apt's connection is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/debian"


def last_good(apt: catalog.Apt) -> dict[str, bytes]:
    """A catalog as a successful refresh leaves it (its lists stand in for
    the real ones): every file under the apt root, by path, with its bytes."""
    for d in ("lists/partial", "cache", "state", "archives/partial"):
        (apt.root / d).mkdir(parents=True, exist_ok=True)
    (apt.root / "status").touch()
    (apt.root / "lists" / "deb.debian.org_debian_dists_trixie_InRelease").write_text("good\n")
    text = apt.sources()
    (apt.root / "sources.list").write_text(text)
    (apt.root / "catalog.json").write_text(json.dumps(
        [{"package": "linux-image-6.12.90+deb13-cloud-amd64", "version": "6.12.90-1",
          "suite": "trixie"}]))
    (apt.root / "state.json").write_text(json.dumps(
        {"sources": text, "updated": time.time(), "served": ["trixie"]}))
    return snapshot(apt.root)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_a_failed_refresh_leaves_the_last_good_catalog(tmp_path, monkeypatch):
    """Another mirror that cannot be reached: the refresh fails in one line
    and the sources, lists, catalog and state are the last good ones, so a
    later run with the usual mirror finds its catalog fresh."""
    monkeypatch.setenv("MMLAB_APT_MIRROR", "http://deb.debian.org/debian")
    apt = catalog.Apt(tmp_path / "apt")
    before = last_good(apt)
    assert apt.fresh()
    monkeypatch.setenv("MMLAB_APT_MIRROR", unreachable_mirror())
    with pytest.raises(MmlabError, match="cannot be reached"):
        apt.refresh(force=True)
    assert snapshot(apt.root) == before
    assert not (apt.root / "refresh").exists()
    monkeypatch.setenv("MMLAB_APT_MIRROR", "http://deb.debian.org/debian")
    assert apt.fresh()


def test_sources_on_disk_that_the_state_does_not_name_are_read_again(tmp_path, monkeypatch):
    """A sources.list another run left poisoned while the state still names
    the usual mirror's: not fresh, so the next run reads the catalog again
    (and its apt never parses the poisoned file for a download)."""
    monkeypatch.setenv("MMLAB_APT_MIRROR", "http://deb.debian.org/debian")
    apt = catalog.Apt(tmp_path / "apt")
    last_good(apt)
    assert apt.fresh()
    (apt.root / "sources.list").write_text("deb not a url; $(id) trixie main\n")
    assert not apt.fresh()
    (apt.root / "sources.list").unlink()
    assert not apt.fresh()


@pytest.mark.parametrize("variable, value, wanted", [
    ("MMLAB_STATE_DIR", "/proc/version", "/proc/version is not a directory"),
    ("MMLAB_STATE_DIR", "/proc/mmlab-state", "proc filesystem"),
    ("MMLAB_STATE_DIR", "/sys/kernel/mmlab/state", "sysfs filesystem"),
    ("MMLAB_KERNEL_CACHE", "/dev/null", "/dev/null is not a directory"),
    ("MMLAB_KERNEL_CACHE", "/dev/mmlab/kernels", "devtmpfs filesystem"),
])
def test_a_folder_that_cannot_be_one_is_refused_first(tmp_path, variable, value, wanted):
    """A one-trial run on the host into a new results directory: refused in
    one line naming the variable, before the store is made."""
    proc = mmlab("run", "pageout-refault", "--samples", "1", "--results", str(tmp_path / "r"),
                 env={variable: value})
    one_line(proc, f"{variable}={value}", wanted)
    assert not (tmp_path / "r").exists()


def test_a_kernel_cache_that_is_a_file_lists_nothing_and_says_why(tmp_path):
    (tmp_path / "file").write_text("")
    for cache in ("/dev/null", str(tmp_path / "file" / "kernels")):
        one_line(mmlab("kernels", "list", env={"MMLAB_KERNEL_CACHE": cache}),
                 f"MMLAB_KERNEL_CACHE={cache}", "is not a directory")
    empty = mmlab("kernels", "list", "--json",
                  env={"MMLAB_KERNEL_CACHE": str(tmp_path / "new" / "kernels")})
    assert empty.returncode == 0 and json.loads(empty.stdout) == [], empty.stderr


@pytest.mark.parametrize("value, wanted", [
    ("/proc/version", "proc filesystem"), ("/dev/null", "not a regular file"),
    ("/sys/kernel/mmlab.lock", "sysfs filesystem"), ("/proc/version/lock", "not a directory"),
])
def test_a_lock_file_that_cannot_be_one_is_refused(monkeypatch, value, wanted):
    monkeypatch.setenv("MMLAB_LOCK", value)
    with pytest.raises(MmlabError, match=f"MMLAB_LOCK={value}: .*{wanted}"):
        paths.env_file("MMLAB_LOCK")


def test_a_bad_lock_file_is_refused_before_a_run_makes_its_store(tmp_path):
    proc = mmlab("run", "pageout-refault", "--samples", "1", "--results", str(tmp_path / "r"),
                 env={"MMLAB_LOCK": "/proc/version"})
    one_line(proc, "MMLAB_LOCK=/proc/version", "proc filesystem")
    assert not (tmp_path / "r").exists()


def test_a_lock_file_in_a_new_directory_is_taken(tmp_path, monkeypatch):
    monkeypatch.setenv("MMLAB_LOCK", str(tmp_path / "new" / "machine.lock"))
    assert paths.env_file("MMLAB_LOCK") == tmp_path / "new" / "machine.lock"
