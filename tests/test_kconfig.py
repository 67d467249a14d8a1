"""A built kernel's config: Debian's of that release by default, with its
modules kept as modules (not built), what the guest needs built in, debug
info off, and every mm, preemption, HZ and debug option compared with
Debian's; the image it comes from; and bad config names and releases the
catalog lacks, refused in one line before anything is built.  The fast
tests read a trimmed copy of Debian's 6.12 cloud config (tests/data) on a
stand-in tree; a slow one configures Debian's real 6.12 source."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from mmlab.errors import MmlabError
from mmlab.kernels import catalog, images, kbuild, kconfig

from .conftest import mmlab

ROOT = Path(__file__).resolve().parents[1]
DEBIAN = ROOT / "tests/data/debian-6.12-cloud.config"
ORIGIN = "linux-image-6.12.118+deb13-cloud-amd64-unsigned 6.12.118-1 (trixie-security)"
SEED003 = ROOT / "experiments/patches/seed003-zap-set-referenced-6.12.patch"
# Where the stand-in tree defines what (the checked families are read by file).
FAMILIES = {"mm/Kconfig": ["LRU_GEN", "LRU_GEN_ENABLED", "KSM", "TRANSPARENT_HUGEPAGE",
                           "TRANSPARENT_HUGEPAGE_ALWAYS", "TRANSPARENT_HUGEPAGE_MADVISE",
                           "ZSMALLOC", "BALLOON_COMPACTION", "HWPOISON_INJECT"],
            "kernel/Kconfig.preempt": ["PREEMPT_NONE", "PREEMPT_VOLUNTARY", "PREEMPT_DYNAMIC"],
            "kernel/Kconfig.hz": ["HZ_250", "HZ"],
            "lib/Kconfig.debug": ["DEBUG_KERNEL", "DEBUG_INFO", "DEBUG_INFO_NONE",
                                  "DEBUG_INFO_DWARF_TOOLCHAIN_DEFAULT", "DEBUG_INFO_BTF"]}


@pytest.fixture
def tree(tmp_path) -> Path:
    """A stand-in kernel tree whose Kconfig files define every option the
    trimmed config and the guest's fragment name."""
    t = tmp_path / "linux"
    named = set(images.settings(DEBIAN.read_text()))
    named |= {kconfig._name(line) for line in kconfig.BASE_FRAGMENT.splitlines()}
    for rel, names in FAMILIES.items():
        (t / rel).parent.mkdir(parents=True, exist_ok=True)
        (t / rel).write_text("".join(f"config {n}\n" for n in names))
        named -= {f"CONFIG_{n}" for n in names}
    (t / "Kconfig").write_text("".join(f"config {n.removeprefix('CONFIG_')}\n" for n in named))
    (t / "Makefile").write_text("VERSION = 6\nPATCHLEVEL = 12\nSUBLEVEL = 118\nEXTRAVERSION =\n")
    return t


def fake_kconfig(tree: Path, ran: list[str], olddefconfig=lambda c: c):
    """kconfig.run: merge_config.sh's -m merge (a fragment's line replaces
    the same option's), `olddefconfig` the rule given, and the log."""
    def run(argv, cwd=None, what=""):
        ran.append(" ".join(argv))
        config = tree / ".config"
        if argv[0].endswith("merge_config.sh"):
            merged = images.settings(config.read_text())
            merged.update(images.settings(Path(argv[-1]).read_text()))
            config.write_text(render(merged))
        elif argv[-1] == "olddefconfig":
            config.write_text(render(olddefconfig(images.settings(config.read_text()))))
        return ""
    return run


def render(values: dict[str, str]) -> str:
    return "".join(f"# {o} is not set\n" if v == "n" else f"{o}={v}\n" for o, v in values.items())


def selects(values: dict[str, str]) -> dict[str, str]:
    """What Kconfig does here: zram built in selects zsmalloc built in, and
    BTF goes with debug info."""
    if values.get("CONFIG_ZRAM") == "y":
        values["CONFIG_ZSMALLOC"] = "y"
    if values.get("CONFIG_DEBUG_INFO_NONE") == "y":
        values["CONFIG_DEBUG_INFO_BTF"] = "n"
    return values


def test_debian_config_keeps_its_modules_and_options_and_builds_in_the_guests(tree,
                                                                              monkeypatch):
    ran: list[str] = []
    monkeypatch.setattr(kconfig, "run", fake_kconfig(tree, ran, selects))
    begin = kconfig.Start("debian", DEBIAN.read_text(), ORIGIN)
    kconfig.configure(tree, [], begin)
    assert not any("tinyconfig" in r for r in ran)
    debian, final = images.settings(begin.text), images.settings((tree / ".config").read_text())
    # A module stays a module (the build makes bzImage only: none is built or
    # loaded), so what Debian builds in because of it stays built in.
    for module in ("CONFIG_KVM", "CONFIG_VIRTIO_NET", "CONFIG_VIRTIO_BALLOON", "CONFIG_HYPERV"):
        assert debian[module] == final[module] == "m"
    assert debian["CONFIG_BALLOON_COMPACTION"] == final["CONFIG_BALLOON_COMPACTION"] == "y"
    # What the guest needs is built in: zram and virtio_blk for swap, ext4.
    for needed in ("CONFIG_ZRAM", "CONFIG_VIRTIO_BLK", "CONFIG_ZSMALLOC"):
        assert debian[needed] == "m" and final[needed] == "y"
    assert final["CONFIG_EXT4_FS"] == final["CONFIG_SERIAL_8250_CONSOLE"] == "y"
    assert final["CONFIG_DEBUG_INFO_NONE"] == "y" and final["CONFIG_DEBUG_INFO_BTF"] == "n"
    # Debian's mm, preemption, HZ and debug options, as Debian has them.
    for option, value in (("CONFIG_TRANSPARENT_HUGEPAGE_ALWAYS", "y"), ("CONFIG_LRU_GEN", "y"),
                          ("CONFIG_LRU_GEN_ENABLED", "y"), ("CONFIG_PREEMPT_VOLUNTARY", "y"),
                          ("CONFIG_PREEMPT_DYNAMIC", "y"), ("CONFIG_HZ", "250"),
                          ("CONFIG_MEMCG", "y"), ("CONFIG_KSM", "y"), ("CONFIG_NUMA", "y"),
                          ("CONFIG_NR_CPUS", "8192"), ("CONFIG_DEBUG_KERNEL", "y")):
        assert debian[option] == final[option] == value, option
    said = kconfig.compare(begin, (tree / ".config").read_text(), tree)
    assert said["built_in"] == ["CONFIG_VIRTIO_BLK", "CONFIG_ZRAM", "CONFIG_ZSMALLOC"]
    assert said["not_kept"] == [] and said["turned_on"] == [] and said["compiler"] == ""
    assert said["line"] == (f"debian (Debian's config, from {ORIGIN}; built in for the guest: "
                            "VIRTIO_BLK, ZRAM, ZSMALLOC; its 19 mm, preemption, HZ and debug "
                            "options as Debian's)")


def test_an_option_that_is_not_debians_is_named(tree, monkeypatch):
    """An mm option olddefconfig changed (here: LRU_GEN_ENABLED and the
    preemption model, as a compiler or a patch might) and Debian's compiler
    are said in the config line."""
    def changes(values: dict[str, str]) -> dict[str, str]:
        values.update({"CONFIG_LRU_GEN_ENABLED": "n", "CONFIG_PREEMPT_VOLUNTARY": "n",
                       "CONFIG_PREEMPT_NONE": "y", "CONFIG_CC_HAS_ASM_GOTO_OUTPUT": "n",
                       "CONFIG_CC_VERSION_TEXT": '"gcc (Debian 12.2.0-14+deb12u1) 12.2.0"'})
        return selects(values)
    monkeypatch.setattr(kconfig, "run", fake_kconfig(tree, [], changes))
    begin = kconfig.Start("debian", DEBIAN.read_text(), ORIGIN)
    kconfig.configure(tree, [], begin)
    said = kconfig.compare(begin, (tree / ".config").read_text(), tree)
    assert said["not_kept"] == ["CONFIG_LRU_GEN_ENABLED=y (now n)",
                                "CONFIG_PREEMPT_NONE=n (now y)",
                                "CONFIG_PREEMPT_VOLUNTARY=y (now n)"]
    assert said["compiler_features"] == ["CONFIG_CC_HAS_ASM_GOTO_OUTPUT"]
    assert ("; Debian's compiler: x86_64-linux-gnu-gcc-14 (Debian 14.2.0-19) 14.2.0, 1 of "
            "Kconfig's compiler features differ here;") in said["line"]
    assert said["line"].endswith("not as Debian's: CONFIG_LRU_GEN_ENABLED=y (now n), "
                                 "CONFIG_PREEMPT_NONE=n (now y), "
                                 "CONFIG_PREEMPT_VOLUNTARY=y (now n))")
    # a guest need that does not stick is an error, as with tinyconfig
    monkeypatch.setattr(kconfig, "run", fake_kconfig(
        tree, [], lambda v: {**v, "CONFIG_VIRTIO_BLK": "m"}))
    with pytest.raises(MmlabError, match="CONFIG_VIRTIO_BLK=y did not stick"):
        kconfig.configure(tree, [], begin)


def test_tiny_starts_from_tinyconfig_without_debians_config(tree, monkeypatch):
    ran: list[str] = []
    monkeypatch.setattr(kconfig, "run", fake_kconfig(tree, ran, selects))
    (tree / ".config").write_text("")
    kconfig.configure(tree, [], kconfig.Start("tiny"))
    assert ran[0] == "make -s tinyconfig"
    assert "DEBUG_INFO" not in (tree / ".mmlab-fragment").read_text()
    assert kconfig.compare(kconfig.Start("tiny"), "", tree)["line"] == \
        "tiny (tinyconfig and the guest's options)"


ROWS = [{"package": "linux-image-6.12.118+deb13-cloud-amd64-unsigned", "version": "6.12.118-1",
         "suite": "trixie-security"},
        {"package": "linux-image-6.12.119+deb13-cloud-amd64-unsigned", "version": "6.12.119-1",
         "suite": "trixie-security"},
        {"package": "linux-image-6.12.118+deb13-amd64-unsigned", "version": "6.12.118-1",
         "suite": "trixie-security"},
        {"package": "linux-source-6.12", "version": "6.12.118-1", "suite": "trixie-security"},
        {"package": "linux-source-7.3", "version": "7.3.4-1", "suite": "sid"}]


def test_the_image_is_the_sources_version_or_says_which(monkeypatch, tmp_path):
    monkeypatch.setattr(catalog.Apt, "catalog", lambda self: ROWS)
    exact = kconfig.image("debian", "6.12.118-1")
    assert exact and (exact.package_version, exact.flavour) == ("6.12.118-1", "cloud")
    generic = kconfig.image("debian-generic", "6.12.118-1")
    assert generic and generic.flavour == "generic"
    same_release = kconfig.image("debian", "6.12.118-2")
    assert same_release and same_release.package_version == "6.12.118-1"
    newest = kconfig.image("debian", "6.12")             # a tree's 6.12.0
    assert newest and newest.package_version == "6.12.119-1"
    assert kconfig.image("tiny", "6.12.118-1") is None
    # the config line says when the image is not the source's version
    (tmp_path / "config").write_text("CONFIG_KSM=y\n")
    fetched = []
    monkeypatch.setattr(images, "ensure", lambda name: fetched.append(name) or images.Kernel(
        name, "6.12.119+deb13-cloud-amd64", "linux-image-6.12.119+deb13-cloud-amd64-unsigned "
        "6.12.119-1 (trixie-security)", "", str(tmp_path), package_version="6.12.119-1"))
    begin = kconfig.start("debian", newest, "6.12.118-9")
    assert fetched == ["debian:6.12.119"] and begin.text == "CONFIG_KSM=y\n"
    assert begin.origin.endswith("(trixie-security), not the source's version 6.12.118-9")
    assert kconfig.start("debian", newest, "6.12.119-1").origin.endswith("(trixie-security)")


def test_a_trees_release_is_read_from_its_makefile(tmp_path):
    cases = [("6", "12", "0", "", "6.12"), ("7", "3", "0", "-rc7", "7.3~rc7"),
             ("6", "12", "118", "", "6.12.118")]
    for version, patchlevel, sublevel, extra, wanted in cases:
        (tmp_path / "Makefile").write_text(f"VERSION = {version}\nPATCHLEVEL = {patchlevel}\n"
                                           f"SUBLEVEL = {sublevel}\nEXTRAVERSION = {extra}\n")
        assert kconfig.tree_release(tmp_path) == wanted
    (tmp_path / "Makefile").write_text("all:\n")
    with pytest.raises(MmlabError, match="names no kernel version, so no Debian config"):
        kconfig.tree_release(tmp_path)


def test_a_config_the_catalog_lacks_is_refused_before_anything_is_built(tree, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setenv("MMLAB_KERNEL_CACHE", str(tmp_path / "cache" / "kernels"))
    monkeypatch.setattr(catalog.Apt, "catalog", lambda self: ROWS)
    (tree / "Makefile").write_text("VERSION = 9\nPATCHLEVEL = 9\nSUBLEVEL = 0\n")
    with pytest.raises(MmlabError, match=r"^--config debian: the Debian catalog has no 9.9 cloud "
                                         r"kernel image to take the config of 9.9 from; give "
                                         r"--config tiny$"):
        kbuild.build(str(tree))
    with pytest.raises(MmlabError, match="no 7.3 generic kernel image"):
        kbuild.config_image("debian-generic", "debian-source:7.3")
    assert not (tmp_path / "cache").exists()


def test_an_unknown_config_is_one_line_and_nothing_is_made(tmp_path):
    env = {"MMLAB_KERNEL_CACHE": str(tmp_path / "cache" / "kernels")}
    for argv in (["kernels", "build", "debian-source:6.12", "--config", "huge"],
                 ["check", str(SEED003), "--base", "debian-source:6.12", "--config", "huge",
                  "--results", str(tmp_path / "r")]):
        proc = mmlab(*argv, env=env)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode not in (0, None) and len(lines) == 1, proc.stderr
        assert "--config huge: unknown config (known: debian, debian-generic, tiny)" in lines[0]
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_debians_real_612_config_keeps_its_mm_options_on_its_source(tmp_path):
    """Debian's 6.12 config on its own source (both fetched once into the
    cache), configured for real in a hard-linked copy: the guest's needs
    built in, Debian's modules still modules, no checked option changed;
    and with every module turned off instead, mm's balloon compaction and
    HMM mirror would be lost.  About 10 s of CPU (3 min beside a load of
    25 here): `make test-slow`."""
    image, version = kbuild.config_image("debian", "debian-source:6.12")
    source, _ = kbuild.source_tree("debian-source:6.12")
    begin = kconfig.start("debian", image, version)
    copy = tmp_path / "linux"
    subprocess.run(["cp", "-al", str(source), str(copy)], check=True)
    kconfig.configure(copy, [], begin)
    final = (copy / ".config").read_text()
    values = images.settings(final)
    assert values["CONFIG_ZRAM"] == values["CONFIG_VIRTIO_BLK"] == values["CONFIG_EXT4_FS"] == "y"
    assert sum(v == "m" for v in values.values()) > 1000
    said = kconfig.compare(begin, final, copy)
    assert said["not_kept"] == [] and "ZRAM" in said["line"], said["line"]
    modules_off = begin.text.replace("=m\n", "=n\n")
    (copy / ".config").write_text(modules_off)
    subprocess.run(["make", "-s", "olddefconfig"], cwd=copy, check=True)
    dropped = kconfig.compare(kconfig.Start("debian", begin.text, "x"),
                              (copy / ".config").read_text(), copy)["not_kept"]
    assert {"CONFIG_BALLOON_COMPACTION=y (now n)", "CONFIG_HMM_MIRROR=y (now n)"} <= set(dropped)


def test_a_fragment_that_is_not_text_is_one_line_and_nothing_is_made(tmp_path):
    """A fragment saved in another encoding, or a binary file given by
    mistake, is named in one line before anything is fetched or built
    (it was a UnicodeDecodeError's traceback)."""
    frag = tmp_path / "latin1.config"
    frag.write_bytes(b"CONFIG_KSM=y\n# caf\xe9\n")
    with pytest.raises(MmlabError, match=r"latin1.config: not a text file \(UTF-8\): byte "
                                         r"0xe9 at offset 18, line 2"):
        kconfig.check_fragment(frag)
    env = {"MMLAB_KERNEL_CACHE": str(tmp_path / "cache" / "kernels")}
    proc = mmlab("kernels", "build", "debian-source:6.12", "--config", "tiny",
                 "--fragment", str(frag), env=env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "latin1.config: not a text file" in lines[0]
    assert sorted(os.listdir(tmp_path)) == ["latin1.config"]


def test_a_fragments_option_no_kconfig_defines_is_refused_before_anything_is_made(
        tree, tmp_path, monkeypatch):
    """A typo in a fragment (KMS for KSM) would be dropped by Kconfig; its
    =y was found only once Debian's image was fetched and the base tree
    copied and configured.  It is one line naming file, line and option
    before either; an option the series' own patches define is known."""
    monkeypatch.setenv("MMLAB_KERNEL_CACHE", str(tmp_path / "cache" / "kernels"))
    frag = tmp_path / "typo.config"
    frag.write_text("# the workloads' needs\nCONFIG_KSM=y\nCONFIG_KMS=y\n"
                    "# CONFIG_GONE_IN_7 is not set\n")      # nothing asked of a gone one
    with pytest.raises(MmlabError, match=r"typo.config:3: CONFIG_KMS: no Kconfig file of "
                                         rf"{re.escape(str(tree))} defines it, nor any patch "
                                         r"given$"):
        kconfig.check_known(tree, [frag], [])
    with pytest.raises(MmlabError, match="typo.config:3: CONFIG_KMS: no Kconfig file"):
        kbuild.build(str(tree), fragments=[frag], config="tiny")
    assert not (tmp_path / "cache").exists()
    adds = tmp_path / "0001-kms.patch"
    adds.write_text("--- a/mm/Kconfig\n+++ b/mm/Kconfig\n@@ -1,1 +1,3 @@\n config LRU_GEN\n"
                    "+config KMS\n+\tbool \"a new option\"\n")
    kconfig.check_known(tree, [frag], [adds])


def test_a_fragment_that_turns_off_what_the_guest_needs_is_named(tmp_path):
    """The user's fragments come last, but the base fragment's =y must
    stick: a fragment asking zram as a module was refused only after the
    build had begun, as an option that did not stick "(unknown option or
    an unmet dependency)", which it is neither."""
    frag = tmp_path / "modules.config"
    frag.write_text("CONFIG_KSM=y\nCONFIG_ZRAM=m\n")
    with pytest.raises(MmlabError, match=r"modules.config:2: CONFIG_ZRAM=m: the guest needs "
                                         r"CONFIG_ZRAM=y \(mmlab's base fragment\)"):
        kconfig.check_fragment(frag)
    frag.write_text("# CONFIG_SWAP is not set\n")
    with pytest.raises(MmlabError, match=r"modules.config:1: # CONFIG_SWAP is not set: the guest"):
        kconfig.check_fragment(frag)
    frag.write_text("CONFIG_ZRAM=y\nCONFIG_ZRAM_DEF_COMP_LZ4=y\n")
    assert kconfig.check_fragment(frag) == ["CONFIG_ZRAM=y", "CONFIG_ZRAM_DEF_COMP_LZ4=y"]


def test_a_kernels_options_are_read_as_a_builds_config_is(tmp_path):
    """One reader of a config (images.settings): a kernel's option and
    features read a hand-edited config (trailing blanks, CRLF line ends) as
    kconfig does (the kernel's own regexes gave 'y ' and NUMA 'n')."""
    (tmp_path / "config").write_text("CONFIG_ZRAM=y\r\nCONFIG_NUMA=y \r\n"
                                     "# CONFIG_KSM is not set\r\nCONFIG_HZ=250\r\n")
    k = images.Kernel("local:x", "6.12.0", "local:x", "", str(tmp_path))
    assert k.option("CONFIG_NUMA") == k.option("CONFIG_ZRAM") == "y"
    assert k.option("CONFIG_HZ") == "250"
    assert k.option("CONFIG_KSM") == k.option("CONFIG_SWAP") == "n"
    assert k.features()["NUMA"] == k.features()["ZRAM"] == "y" and k.features()["KSM"] == "n"
    assert {o: k.option(o) for o in images.settings((tmp_path / "config").read_text())} == \
        images.settings((tmp_path / "config").read_text())


def test_a_builds_git_and_make_run_through_kconfigs_one_runner(monkeypatch, tmp_path):
    """kbuild had a copy of kconfig's runner: one runner now, so a build's
    commands are what kconfig.run runs."""
    ran = []

    def fake(argv, cwd=None, what=""):
        ran.append(argv[3] if argv[0] == "git" else argv[0])
        return {"rev-parse": "a1\n", "rev-list": "b2\nc3\n"}.get(argv[3], "")
    monkeypatch.setattr(kconfig, "run", fake)
    assert kbuild.commits(tmp_path, "a1..c3") == ["a1", "b2", "c3"]
    assert ran == ["rev-parse", "rev-list"]


def test_kernels_builds_config_default_is_the_builds(monkeypatch):
    """`mmlab kernels build`, `ab` and `narrow` without --config ask for
    kconfig.DEFAULT rather than a copy of it of their own ("debian")."""
    from typer.testing import CliRunner

    from mmlab.cli import app
    asked = []

    def build(source, patches, fragments, name, on_line, config):
        asked.append(config)
        raise MmlabError("stop here")
    monkeypatch.setattr(kbuild, "build", build)
    monkeypatch.setattr(kconfig, "DEFAULT", "debian-generic")
    done = CliRunner().invoke(app, ["kernels", "build", "debian-source:6.12"])
    assert done.exit_code != 0 and asked == ["debian-generic"]
    CliRunner().invoke(app, ["kernels", "build", "debian-source:6.12", "--config", "tiny"])
    assert asked == ["debian-generic", "tiny"]
