"""Kernel builds without building: cache keys, patch and fragment errors, and
the config check, on a tiny stand-in tree.  A real build is a slow test
(kconfig's own tests are in test_kconfig.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import subprocess
import time
from pathlib import Path

import pytest

from mmlab.errors import MmlabError
from mmlab.kernels import catalog, images, kbuild, kconfig, series
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


def test_cache_key_follows_source_config_patches_and_fragments(tmp_path):
    p1, p2 = tmp_path / "1.patch", tmp_path / "2.patch"
    p1.write_text("one")
    p2.write_text("two")
    frag = tmp_path / "f.config"
    frag.write_text("CONFIG_KSM=y\n")
    debian = kconfig.Start("debian", "CONFIG_KSM=y\n", "linux-image-x 1-1")

    def key(source: str, patches: list[Path], fragments: list[Path],
            begin: kconfig.Start = debian) -> str:
        return kbuild.build_key(kbuild.Recipe(source, begin, fragments), patches)
    base = key("src 1", [], [])
    assert base == key("src 1", [], [])                                 # stable
    keys = {base, key("src 2", [], []), key("src 1", [p1], []),
            key("src 1", [p2], []), key("src 1", [p1, p2], []),
            key("src 1", [p2, p1], []), key("src 1", [], [frag]),
            key("src 1", [], [], kconfig.Start("tiny")),
            key("src 1", [], [], kconfig.Start("debian-generic", debian.text)),
            key("src 1", [], [], kconfig.Start("debian", "CONFIG_KSM=n\n"))}
    assert len(keys) == 10                                               # every input counts
    # where Debian's config came from is said, but only the config itself is built
    assert key("src 1", [], [], kconfig.Start("debian", debian.text, "elsewhere")) == base
    # a tiny build's key is the one it had before there was a config choice
    before = hashlib.sha256(b"src 1" + kconfig.BASE_FRAGMENT.encode() + b"patch\0one")
    assert key("src 1", [p1], [], kconfig.Start("tiny")) == before.hexdigest()


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
        kconfig.check_fragment(frag)
    with pytest.raises(MmlabError, match="no such config fragment"):
        kconfig.check_fragment(tmp_path / "nope.config")
    ok = tmp_path / "ok.config"
    ok.write_text('CONFIG_NR_CPUS=8\n# CONFIG_LRU_GEN is not set\nCONFIG_CMDLINE="x"\n')
    assert len(kconfig.check_fragment(ok)) == 3


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
    """About 7 minutes on 2 cores with the tiny config; with Debian's, its
    base build is roughly four times the tiny one's (kept after): `make test-slow`."""
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
    # Debian's config of 6.12.118, its checked options as Debian has them, and
    # what the guest needs built in: it loads no module
    said = k.details["config_start"]
    assert k.details["config"].startswith("debian (Debian's config, from linux-image-6.12.")
    assert said["not_kept"] == [] and {"CONFIG_ZRAM", "CONFIG_VIRTIO_BLK"} <= set(said["built_in"])
    assert k.option("CONFIG_ZRAM") == k.option("CONFIG_VIRTIO_BLK") == "y" and not k.modules
    assert k.option("CONFIG_LRU_GEN_ENABLED") == k.option("CONFIG_PREEMPT_DYNAMIC") == "y"
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
    assert kconfig.symbols(tree) == {"CONFIG_KSM", "CONFIG_SWAP"}
    ran = []

    def fake_run(argv, cwd=None, what=""):
        ran.append(argv)
        if argv[0].endswith("merge_config.sh"):
            (tree / ".config").write_text("CONFIG_KSM=y\nCONFIG_SWAP=y\n")
        return ""
    monkeypatch.setattr(kconfig, "run", fake_run)
    kconfig.configure(tree, [], kconfig.Start("tiny"))
    assert (tree / ".mmlab-fragment").read_text() == "CONFIG_SWAP=y\nCONFIG_KSM=y\n"
    frag = tmp_path / "user.config"
    frag.write_text("CONFIG_ZRAM=y\n")
    with pytest.raises(MmlabError, match="CONFIG_ZRAM=y did not stick"):
        kconfig.configure(tree, [frag], kconfig.Start("tiny"))


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


@pytest.mark.slow
def test_a_patched_kernel_is_an_incremental_build_of_the_kept_base(capsys, tmp_path):
    """The base's build tree is kept; a one-line patch rebuilds its object
    and the link, and a series builds each patch on the one before's tree.
    The patches are this run's own copies (a header line of their own), so
    their kernels are built here, not found in the cache from an earlier
    run or test (a series whose first kernel is cached builds its second
    on the base's tree, both patches' objects).  About 3 minutes on 2
    cores when the base is kept (88 s of it the one-line patch, 31 s of
    that make), plus the base's build when it is not: `make test-slow`."""
    from mmlab import workloads
    from mmlab.bench.check_speed import fresh_copy
    from mmlab.machine.knobs import HostSettings
    from mmlab.targets import qemu
    seed003 = fresh_copy(PATCHES / "seed003-zap-set-referenced-6.12.patch", tmp_path)
    seed004 = fresh_copy(PATCHES / "seed004-ksm-rmap-walk-range-6.12.patch", tmp_path)
    base = kbuild.build("debian-source:6.12")
    start = time.monotonic()
    one_line = kbuild.build("debian-source:6.12", [seed003])
    took = time.monotonic() - start
    _, ksm, both = kbuild.build_series("debian-source:6.12", [seed004, seed003], [])
    tree, _ = kbuild.source_tree("debian-source:6.12")
    assert series.read([seed004])[0].functions(tree) == [("mm/ksm.c", "rmap_walk_ksm")]
    assert "mm/memory.o" in compiled(one_line) and len(compiled(one_line)) <= 6
    assert "mm/ksm.o" in compiled(ksm) and "mm/memory.o" not in compiled(ksm)
    assert "mm/memory.o" in compiled(both) and "mm/ksm.o" not in compiled(both)   # on ksm's tree
    assert len(compiled(ksm)) <= 6 and len(compiled(both)) <= 6
    assert base.details["compiler"].startswith("gcc") and one_line.details["make_s"] > 0
    with capsys.disabled():
        print(f"\nmake: base {base.details['make_s']} s, one-line patch "
              f"{one_line.details['make_s']} s ({took:.1f} s in all), series "
              f"{ksm.details['make_s']} s and {both.details['make_s']} s; compiled "
              f"{compiled(one_line)}, {compiled(ksm)}, {compiled(both)}")
    guest = boot.Guest(both, vcpus=1, memory_mb=256, timeout_s=300)
    (s,) = qemu.sample(guest, workloads.get("ksm-rmap"), {"vmas": 200}, 1, 0, HostSettings())
    assert s.state["kernel"] == both.version and not s.errors


FAKE_MAKEFILE = """\
OBJS := mm/ksm.o mm/memory.o
TOOL_BUILT_IN := $(shell cat .tool.cmd 2>/dev/null)
bzImage: $(OBJS)
\tmkdir -p arch/x86/boot include/generated
\tcat $(OBJS) > arch/x86/boot/bzImage
\tcp arch/x86/boot/bzImage System.map
\techo '#define LINUX_COMPILER\t"gcc (fake) 1.0"' > include/generated/compile.h
%.o: %.c tool
\t@echo '  CC      $@'
\t@if grep -q broken $<; then echo "$<:1:1: error: expected ';'"; exit 1; fi
\tcp $< $@
tool: tool.c $(if $(filter $(CURDIR),$(TOOL_BUILT_IN)),,FORCE)
\t@echo '  CC      $@'
\tcp $< $@
\techo $(CURDIR) > .tool.cmd
FORCE:
kernelrelease:
\t@echo 6.99.0-fake
"""


@pytest.fixture
def made_tree(tmp_path, monkeypatch) -> Path:
    """A stand-in kernel tree built by a real make, whose objects are written
    in place (as a compiler's output is), with a tool every object depends
    on that is built again when the folder its command names is not the
    tree's (as objtool is), and a private kernel cache.  Its config is a
    stand-in for Debian's, from no catalog."""
    monkeypatch.setenv("MMLAB_KERNEL_CACHE", str(tmp_path / "cache" / "kernels"))
    monkeypatch.setattr(kbuild, "config_image", lambda config, spec: (None, "6.99.0"))
    monkeypatch.setattr(kconfig, "start", lambda config, entry, version: kconfig.Start(
        config, "CONFIG_KSM=m\n", "a stand-in image 6.99.0-1"))
    monkeypatch.setattr(kconfig, "configure", lambda tree, fragments, begin:
                        (tree / ".config").write_text("CONFIG_KSM=y\n"))
    t = tmp_path / "linux"
    (t / "mm").mkdir(parents=True)
    (t / "Makefile").write_text(FAKE_MAKEFILE)
    (t / "Kconfig").write_text("")
    (t / "mm" / "ksm.c").write_text("ksm 1\n")
    (t / "mm" / "memory.c").write_text("memory 1\n")
    (t / "tool.c").write_text("objtool\n")
    return t


def diff_of(tmp_path: Path, name: str, path: str, old: str, new: str) -> Path:
    a, b = tmp_path / name / "a" / path, tmp_path / name / "b" / path
    a.parent.mkdir(parents=True), b.parent.mkdir(parents=True)
    a.write_text(old), b.write_text(new)
    diff = subprocess.run(["diff", "-u", f"a/{path}", f"b/{path}"], cwd=tmp_path / name,
                          capture_output=True, text=True).stdout
    (tmp_path / f"{name}.patch").write_text(diff)
    return tmp_path / f"{name}.patch"


def compiled(k: images.Kernel) -> list[str]:
    return sorted(re.findall(r"^\s+CC\s+(\S+)$", (Path(k.dir) / "build.log").read_text(), re.M))


def test_a_series_is_built_patch_by_patch_on_the_kept_base(made_tree, tmp_path):
    p1 = diff_of(tmp_path, "p1", "mm/ksm.c", "ksm 1\n", "ksm 2\n")
    p2 = diff_of(tmp_path, "p2", "mm/memory.c", "memory 1\n", "memory 2\n")
    base, k1, k2 = kbuild.build_series(str(made_tree), [p1, p2], [])
    assert compiled(base) == ["mm/ksm.o", "mm/memory.o", "tool"]
    assert compiled(k1) == ["mm/ksm.o"] and compiled(k2) == ["mm/memory.o"]   # incremental
    image = lambda k: (Path(k.dir) / "vmlinuz").read_text()                  # noqa: E731
    assert image(base) == "ksm 1\nmemory 1\n" and image(k1) == "ksm 2\nmemory 1\n"
    assert image(k2) == "ksm 2\nmemory 2\n"
    assert k2.details["compiler"] == "gcc (fake) 1.0" and k2.details["make_s"] >= 0
    # the config's start and how the final config stands to it, with every kernel
    assert k2.details["config"].startswith("debian (Debian's config, from a stand-in image")
    assert k2.details["config_start"]["built_in"] == ["CONFIG_KSM"]         # =m -> =y
    kept = kbuild.build_cache() / "bases" / base.details["build_key"][:16]
    assert (kept / "tree" / "mm" / "ksm.o").read_text() == "ksm 1\n"       # never written through
    assert (made_tree / "mm" / "ksm.c").read_text() == "ksm 1\n"            # pristine untouched
    assert kbuild.build(str(made_tree), [p1, p2]).dir == k2.dir              # a cache hit
    # A second check against the cached base builds only the patched side.
    made = (kept / "outputs").stat().st_mtime_ns
    p3 = diff_of(tmp_path, "p3", "mm/memory.c", "memory 1\n", "memory 3\n")
    k3 = kbuild.build(str(made_tree), [p3], name="p3")
    assert compiled(k3) == ["mm/memory.o"] and image(k3) == "ksm 1\nmemory 3\n"
    assert (kept / "outputs").stat().st_mtime_ns == made and k3.name == "build:p3"
    a, b = kbuild.ab_pair(str(made_tree), [p3], [])
    assert (a.dir, b.dir) == (base.dir, k3.dir)


def test_a_later_patch_that_conflicts_is_refused_before_anything_is_built(made_tree, tmp_path):
    p1 = diff_of(tmp_path, "p1", "mm/ksm.c", "ksm 1\n", "ksm 2\n")
    clash = diff_of(tmp_path, "clash", "mm/ksm.c", "ksm 1\n", "ksm 3\n")
    with pytest.raises(MmlabError, match=r"patch .*clash.patch does not apply: mm/ksm.c: Hunk #1"):
        kbuild.build_series(str(made_tree), [p1, clash], [])
    assert not kbuild.build_cache().exists() and not images.cached()
    with pytest.raises(MmlabError, match="no such file"):
        kbuild.build(str(made_tree), [tmp_path / "nope.patch"])


def test_a_patch_that_changes_kconfig_gets_the_config_made_again(made_tree, tmp_path,
                                                                  monkeypatch):
    configured = []
    monkeypatch.setattr(kconfig, "configure", lambda tree, fragments, begin:
                        configured.append(tree) or
                        (tree / ".config").write_text(f"CONFIG_KSM=y\n#{len(configured)}\n"))
    p1 = diff_of(tmp_path, "p1", "Kconfig", "", "config X\n")
    p2 = diff_of(tmp_path, "p2", "mm/ksm.c", "ksm 1\n", "ksm 2\n")
    base, k1, k2 = kbuild.build_series(str(made_tree), [p1, p2], [])
    assert len(configured) == 2                       # the base, then after the Kconfig patch
    assert compiled(k2) == ["mm/ksm.o"]


def test_a_commits_build_keeps_no_base_tree(made_tree, tmp_path):
    """Each commit of a narrowing is a source of its own, built once: its
    built tree (178 MB for 6.12) is not kept."""
    git = ["git", "-C", str(made_tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    (made_tree / "mm" / "ksm.c").write_text("ksm 2\n")
    subprocess.run([*git, "commit", "-qam", "ksm 2"], check=True)
    names, ensure = kbuild.commit_kernels(made_tree, "HEAD~1..HEAD", [])
    ensure(names[1])
    (k,) = images.cached()
    assert (Path(k.dir) / "vmlinuz").read_text() == "ksm 2\nmemory 1\n"
    assert k.name == names[1] and not [d for d in (kbuild.build_cache() / "bases").iterdir()
                                       if d.is_dir()]


def test_a_base_build_cut_short_resumes_where_it_stopped(made_tree):
    """A base whose make stopped (here: failed on mm/memory.c, after
    mm/ksm.o) is not built again from scratch: its configured tree is
    made where it stopped."""
    (made_tree / "mm/memory.c").write_text("memory broken\n")
    with pytest.raises(MmlabError, match="kernel build failed"):
        kbuild.build(str(made_tree))
    (kept,) = [d for d in (kbuild.build_cache() / "bases").iterdir() if d.is_dir()]
    assert (kept / "tree/mm/ksm.o").is_file() and not (kept / "outputs").exists()
    (made_tree / "mm/memory.c").write_text("memory 1\n")    # the kept tree links to it
    base = kbuild.build(str(made_tree))
    log = (Path(base.dir) / "build.log").read_text()
    assert "error: expected ';'" in log.split("mmlab: make resumed")[0]
    assert re.findall(r"^\s+CC\s+(\S+)$", log.split("mmlab: make resumed")[1], re.M) == \
        ["mm/memory.o"]
    assert (Path(base.dir) / "vmlinuz").read_text() == "ksm 1\nmemory 1\n"


def test_a_patched_build_that_fails_says_the_compilers_last_lines(made_tree, tmp_path):
    broken = diff_of(tmp_path, "broken", "mm/ksm.c", "ksm 1\n", "ksm broken\n")
    with pytest.raises(MmlabError, match=r"kernel build failed \(log .*build.log\): .*"
                                         r"mm/ksm.c:1:1: error: expected ';'"):
        kbuild.build(str(made_tree), [broken])
    (base,) = images.cached()                                  # the base only, and kept
    assert not base.details["patches"] and (kbuild.base_dir(base.details["build_key"])
                                            / "outputs").is_file()
