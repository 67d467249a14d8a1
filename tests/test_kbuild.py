"""Kernel builds without building: cache keys, patch and fragment errors, and
the config check, on a tiny stand-in tree.  A real build is a slow test."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from mmlab.errors import MmlabError
from mmlab.kernels import catalog, images, kbuild
from mmlab.targets import boot

PATCHES = Path(__file__).resolve().parents[1] / "experiments" / "patches"


@pytest.fixture
def tree(tmp_path) -> Path:
    t = tmp_path / "tree"
    (t / "mm").mkdir(parents=True)
    (t / "mm" / "ksm.c").write_text("int a;\nint walk(void)\n{\n\treturn 0;\n}\n")
    return t


def write_patch(tmp_path: Path, old: str, new: str) -> Path:
    a, b = tmp_path / "a" / "mm", tmp_path / "b" / "mm"
    a.mkdir(parents=True), b.mkdir(parents=True)
    (a / "ksm.c").write_text(old)
    (b / "ksm.c").write_text(new)
    diff = subprocess.run(["diff", "-u", "a/mm/ksm.c", "b/mm/ksm.c"], cwd=tmp_path,
                          capture_output=True, text=True).stdout
    p = tmp_path / "change.patch"
    p.write_text(diff)
    return p


def test_cache_key_follows_source_patches_and_fragments(tmp_path):
    p1, p2 = tmp_path / "1.patch", tmp_path / "2.patch"
    p1.write_text("one")
    p2.write_text("two")
    frag = tmp_path / "f.config"
    frag.write_text("CONFIG_KSM=y\n")
    base = kbuild.build_key("src 1", [], [])
    assert base == kbuild.build_key("src 1", [], [])                     # stable
    keys = {base, kbuild.build_key("src 2", [], []), kbuild.build_key("src 1", [p1], []),
            kbuild.build_key("src 1", [p2], []), kbuild.build_key("src 1", [p1, p2], []),
            kbuild.build_key("src 1", [p2, p1], []), kbuild.build_key("src 1", [], [frag])}
    assert len(keys) == 7                                                # every input counts


def test_a_patch_that_applies_changes_only_the_copy(tree, tmp_path):
    p = write_patch(tmp_path, (tree / "mm/ksm.c").read_text(),
                    "int a;\nint walk(void)\n{\n\treturn 1;\n}\n")
    kbuild.apply_patch(tree, p)
    assert "return 1;" in (tree / "mm/ksm.c").read_text()


def test_a_patch_that_does_not_apply_names_file_and_hunk(tree, tmp_path):
    p = write_patch(tmp_path, "int b;\nint other(void)\n{\n\treturn 5;\n}\n",
                    "int b;\nint other(void)\n{\n\treturn 6;\n}\n")
    with pytest.raises(MmlabError, match=r"patch .*change.patch does not apply: mm/ksm.c: "
                                         r"Hunk #1 FAILED"):
        kbuild.apply_patch(tree, p)
    assert "return 0;" in (tree / "mm/ksm.c").read_text()                # untouched
    with pytest.raises(MmlabError, match="no such patch"):
        kbuild.apply_patch(tree, tmp_path / "missing.patch")


def test_a_broken_fragment_names_file_and_line(tmp_path):
    frag = tmp_path / "bad.config"
    frag.write_text("# comment\nCONFIG_KSM=y\nCONFIG_THP = yes please\n")
    with pytest.raises(MmlabError, match=r"bad.config:3: not a config line"):
        kbuild.check_fragment(frag)
    with pytest.raises(MmlabError, match="no such config fragment"):
        kbuild.check_fragment(tmp_path / "nope.config")
    ok = tmp_path / "ok.config"
    ok.write_text('CONFIG_NR_CPUS=8\n# CONFIG_ZRAM is not set\nCONFIG_CMDLINE="x"\n')
    assert len(kbuild.check_fragment(ok)) == 3


def test_bad_sources_are_named():
    with pytest.raises(MmlabError, match="debian-source:6: expected debian-source:MAJOR.MINOR"):
        kbuild.source_tree("debian-source:6")
    with pytest.raises(MmlabError, match="not a kernel source tree"):
        kbuild.source_tree("/tmp")


def test_the_seed_patches_are_shipped_for_6_12_and_7_3():
    names = {p.name for p in PATCHES.glob("*.patch")}
    assert {"seed004-ksm-rmap-walk-range-6.12.patch",
            "seed003-zap-set-referenced-6.12.patch",
            "seed003-zap-set-referenced-7.3.patch"} <= names
    # 7.3 walks only the rmap_item's own page index already: no seed004 port.
    assert "seed004-ksm-rmap-walk-range-7.3.patch" not in names
    text = (PATCHES / "seed004-ksm-rmap-walk-range-6.12.patch").read_text()
    assert "-\t\t\t\t\t       0, ULONG_MAX) {" in text and "pgoff_start, pgoff_end) {" in text


@pytest.mark.slow
def test_a_real_build_boots_and_a_second_request_is_a_cache_hit(tmp_path):
    """About 7 minutes on 2 cores: `make test-slow`."""
    from mmlab import workloads
    from mmlab.attribution import functions
    from mmlab.machine.knobs import HostSettings
    from mmlab.targets import qemu
    k = kbuild.build("debian-source:6.12", [PATCHES / "seed004-ksm-rmap-walk-range-6.12.patch"])
    again = kbuild.build("debian-source:6.12",
                         [PATCHES / "seed004-ksm-rmap-walk-range-6.12.patch"])
    assert again.dir == k.dir and again.details["build_key"] == k.details["build_key"]
    feats = k.features()
    assert feats["KSM"] == feats["THP"] == feats["ADVISE_SYSCALLS"] == "y"
    table = functions.SymbolTable.load(k.symbols)       # the build's System.map, kept
    assert "rmap_walk_ksm" in table.names and table.offsets[0] >= 0
    guest = boot.Guest(k, vcpus=1, memory_mb=256, timeout_s=300)
    small = {"mapping-kb": 1024, "rounds": 1, "min-ms": 0}
    sized = {"size-kb": 1024, "rounds": 1, "min-ms": 0}
    params = {"ksm-rmap": {"vmas": 200}, "mremap-churn": {"seconds": 0.2},
              "populate-unmap": {"seconds": 0.2},
              "unmap-young": {"size-kb": 1024, "backing": "shmem", "rounds": 1, "min-ms": 0},
              "pageout-refault": small, "madvise": small, "mincore-mlock": small,
              "fork-cow": small, "page-fault": sized, "mprotect": sized, "mremap-ops": sized,
              "munmap-zap": sized, "reclaim": {"rounds": 1, "min-ms": 0}}
    for name in workloads.registry():
        g = dataclasses.replace(guest, numa_nodes=2) if name == "migrate" else guest
        (s,) = qemu.sample(g, workloads.get(name), params.get(name, {}), 1, 0, HostSettings())
        assert s.state["kernel"] == k.version and not s.errors, (name, s.errors)
    assert images.get(k.name).details["patches"][0]["sha256"]


def test_commit_ranges_and_worktrees_come_from_git(tmp_path, monkeypatch):
    monkeypatch.setenv("MMLAB_KERNEL_CACHE", str(tmp_path / "cache" / "kernels"))
    repo = tmp_path / "linux"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    shas = []
    for i in range(4):
        (repo / "Makefile").write_text(f"# version {i}\n")
        (repo / "Kconfig").write_text("")
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", f"c{i}"], check=True)
        shas.append(subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True,
                                   text=True).stdout.strip())
    assert kbuild.commits(repo, f"{shas[0]}..{shas[3]}") == shas
    tree = kbuild.checkout(repo, shas[2])
    assert (tree / "Makefile").read_text() == "# version 2\n"
    assert kbuild.checkout(repo, shas[2]) == tree                       # made once
    _, source_id = kbuild.source_tree(str(tree))
    assert source_id.endswith(shas[2][:7]) or shas[2][:7] in source_id   # the key sees the commit
    with pytest.raises(MmlabError, match="expected OLD..NEW"):
        kbuild.commits(repo, shas[0])
    with pytest.raises(MmlabError, match="no commits in that range"):
        kbuild.commits(repo, f"{shas[3]}..{shas[3]}")


def test_base_options_a_tree_does_not_define_are_left_out(tmp_path, monkeypatch):
    """PROC_SYSCTL is gone in 7.x; the base fragment must not fail on it, while
    a user's option that does not stick still does."""
    tree = tmp_path / "t"
    (tree / "init").mkdir(parents=True)
    (tree / "init" / "Kconfig").write_text("config KSM\n\tbool \"ksm\"\nmenuconfig SWAP\n")
    assert kbuild.kconfig_symbols(tree) == {"CONFIG_KSM", "CONFIG_SWAP"}
    ran = []

    def fake_run(argv, cwd=None, what=""):
        ran.append(argv)
        if argv[0].endswith("merge_config.sh"):
            (tree / ".config").write_text("CONFIG_KSM=y\nCONFIG_SWAP=y\n")
        return ""
    monkeypatch.setattr(kbuild, "_run", fake_run)
    kbuild.configure(tree, [])
    assert (tree / ".mmlab-fragment").read_text() == "CONFIG_SWAP=y\nCONFIG_KSM=y\n"
    frag = tmp_path / "user.config"
    frag.write_text("CONFIG_ZRAM=y\n")
    with pytest.raises(MmlabError, match="CONFIG_ZRAM=y did not stick"):
        kbuild.configure(tree, [frag])


def test_debian_sources_come_from_the_catalog(monkeypatch):
    rows = [{"package": "linux-source-7.3", "version": "7.3~rc7-1~exp1", "suite": "experimental"},
            {"package": "linux-source-7.3", "version": "7.3.4-1~bpo13+1",
             "suite": "trixie-backports"},
            {"package": "linux-source-6.12", "version": "6.12.117-1", "suite": "trixie"}]
    monkeypatch.setattr(catalog.Apt, "catalog", lambda self: rows)
    assert kbuild.debian_source("7.3") == ("linux-source-7.3", "7.3.4-1~bpo13+1",
                                           "trixie-backports")
    with pytest.raises(MmlabError, match=r"no linux-source-6.19 \(sources it has: 6.12, 7.3\)"):
        kbuild.debian_source("6.19")
