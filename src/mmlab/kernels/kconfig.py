"""A built kernel's config: Debian's for that release (the default), so a
checked kernel is the kernel users run plus the patch, or tinyconfig, the
fastest to build.

`debian` starts from the config of Debian's cloud linux-image of the same
package version as the source (`debian-generic`: the generic flavour's);
when the catalog has no image of that version, the image of the same
upstream release, else the series' newest, and the config line says so.
Its modules stay modules in the config: a build makes bzImage only, so none
is built, stored or loaded, while the code Debian builds in because a module
selects or enables it stays built in, as in the kernel users run (turning
every =m off on 6.12 took 308 of Debian's built-in options with it, mm's
BALLOON_COMPACTION, MEMORY_BALLOON and HMM_MIRROR among them).  What a QEMU
guest and the workloads need (BASE_FRAGMENT: zram and virtio_blk for guest
swap, ext4 for the scratch disk, ...) is built in, and debug info is left
out: it changes no instruction of the kernel, and would make every build
slower and every kept tree several times larger.  After olddefconfig (which
also settles what this machine's compiler can do), every option of mm's
Kconfig, the preemption model, HZ, memcg, NUMA and the kernel's debug
options is compared with Debian's, and one that differs is named in the
kernel's config line.

`tiny` is tinyconfig plus BASE_FRAGMENT.  Either way the user's fragments
come last, and every =y asked for must end up in the final config.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.kernels import catalog, images, specs, versions
from mmlab.machine import proc

# Config names and the Debian flavour each starts from (None: tinyconfig).
NAMES = {"debian": "cloud", "debian-generic": "generic", "tiny": None}
DEFAULT = "debian"

BASE_FRAGMENT = """\
CONFIG_64BIT=y
CONFIG_SMP=y
CONFIG_PRINTK=y
CONFIG_PRINTK_TIME=y
CONFIG_TTY=y
CONFIG_SERIAL_8250=y
CONFIG_SERIAL_8250_CONSOLE=y
CONFIG_BLK_DEV_INITRD=y
CONFIG_RD_GZIP=y
CONFIG_BINFMT_ELF=y
CONFIG_BINFMT_SCRIPT=y
CONFIG_DEVTMPFS=y
CONFIG_PROC_FS=y
CONFIG_PROC_SYSCTL=y
CONFIG_PROC_PAGE_MONITOR=y
CONFIG_SYSFS=y
CONFIG_TMPFS=y
CONFIG_SHMEM=y
CONFIG_MEMFD_CREATE=y
CONFIG_FUTEX=y
CONFIG_EPOLL=y
CONFIG_POSIX_TIMERS=y
CONFIG_MULTIUSER=y
CONFIG_ADVISE_SYSCALLS=y
CONFIG_BLOCK=y
CONFIG_SWAP=y
CONFIG_TRANSPARENT_HUGEPAGE=y
CONFIG_HUGETLBFS=y
CONFIG_USERFAULTFD=y
CONFIG_KSM=y
CONFIG_COMPACTION=y
CONFIG_MIGRATION=y
CONFIG_NUMA=y
CONFIG_CGROUPS=y
CONFIG_MEMCG=y
CONFIG_PCI=y
CONFIG_ACPI=y
CONFIG_HIGH_RES_TIMERS=y
CONFIG_FTRACE=y
CONFIG_FUNCTION_TRACER=y
CONFIG_FUNCTION_GRAPH_TRACER=y
CONFIG_DYNAMIC_FTRACE=y
CONFIG_KPROBES=y
CONFIG_KPROBE_EVENTS=y
CONFIG_HIST_TRIGGERS=y
CONFIG_BLK_DEV=y
CONFIG_ZRAM=y
CONFIG_CRYPTO=y
CONFIG_CRYPTO_LZO=y
CONFIG_VIRTIO_MENU=y
CONFIG_VIRTIO_PCI=y
CONFIG_VIRTIO_BLK=y
CONFIG_EXT4_FS=y
CONFIG_X86_64_ACPI_NUMA=y
"""

# What the guest needs, which no fragment may turn off (each must stick).
BASE_OPTIONS = frozenset(re.findall(r"^(CONFIG_\w+)=y$", BASE_FRAGMENT, re.M))

# Debug info off: no instruction changes, and BTF (which needs it) goes too.
NO_DEBUG_INFO = """\
CONFIG_DEBUG_INFO_NONE=y
# CONFIG_DEBUG_INFO_DWARF_TOOLCHAIN_DEFAULT is not set
# CONFIG_DEBUG_INFO_DWARF4 is not set
# CONFIG_DEBUG_INFO_DWARF5 is not set
# CONFIG_DEBUG_INFO is not set
"""
LEFT_OUT = re.compile(r"DEBUG_INFO|BTF|PAHOLE")

# Where the options compared with Debian's are defined, and those defined elsewhere.
CHECKED_KCONFIGS = ("mm/Kconfig", "mm/Kconfig.debug", "kernel/Kconfig.preempt",
                    "kernel/Kconfig.hz", "lib/Kconfig.debug")
CHECKED = ("MEMCG", "NUMA", "NODES_SHIFT", "NR_CPUS")

FRAGMENT_LINE = re.compile(r'^(CONFIG_[A-Za-z0-9_]+)=(y|m|n|-?\d+|0x[0-9a-fA-F]+|"[^"]*")$'
                           r'|^# (CONFIG_[A-Za-z0-9_]+) is not set$')
# An option a Kconfig file defines, and one a patch's added line defines.
DEFINED = re.compile(r"^\s*(?:menu)?config\s+(\w+)", re.M)
ADDED = re.compile(r"^\+\s*(?:menu)?config\s+(\w+)", re.M)
YES = re.compile(r"^(CONFIG_\w+)=y$")     # what must stick in the final config


@dataclass(frozen=True)
class Start:
    """Where a build's config starts: `text`, Debian's config, from
    `origin` (the image and, when it is not the source's version, which
    that is); tinyconfig when `text` is empty."""
    name: str
    text: str = ""
    origin: str = ""

    def key(self) -> bytes:
        """What the build key hashes: the name and Debian's config itself;
        nothing for tinyconfig, so a tiny build's key is what it was before
        there was a choice, and its kept base and kernels stay cache hits."""
        if not self.text:
            return b""
        return f"config\0{self.name}\0".encode() + hashlib.sha256(self.text.encode()).digest()


def check_name(name: str) -> None:
    """Refuse a --config no build knows, before a source or image is fetched."""
    if name not in NAMES:
        raise MmlabError(f"--config {name}: unknown config (known: {', '.join(NAMES)})")


def run(argv: list[str], cwd: Path | None = None, what: str = "") -> str:
    """A build tool's output (make, git, patch, dpkg-deb: kbuild's too), its
    failure an MmlabError naming `what`."""
    return proc.call(argv, cwd=cwd, what=what or argv[0]).stdout


def tree_release(tree: Path) -> str:
    """The release a kernel tree's Makefile names, as an upstream version
    that orders as Debian's do (6.12.0 -> 6.12, 7.3.0-rc7 -> 7.3~rc7)."""
    return release_of((tree / "Makefile").read_text(errors="replace"), str(tree))


def release_of(text: str, where: str) -> str:
    """tree_release of a Makefile's text (`where` names it in an error), so a
    commit's release is read from git without checking the commit out."""
    parts = {k: v.strip() for k, v in re.findall(r"^(VERSION|PATCHLEVEL|SUBLEVEL|EXTRAVERSION)"
                                                 r"\s*=(.*)$", text, re.M)}
    release = (f"{parts.get('VERSION', '')}.{parts.get('PATCHLEVEL', '')}."
               f"{parts.get('SUBLEVEL') or 0}{parts.get('EXTRAVERSION', '')}")
    found = versions.release_upstream(release)
    if not found:
        raise MmlabError(f"{where}: its Makefile names no kernel version, so no Debian config "
                         "matches it; give --config tiny")
    return found


def image(name: str, version: str, apt: catalog.Apt | None = None) -> catalog.Entry | None:
    """The Debian image whose config `name` starts from, for a source of
    `version` (a package version, 6.12.118-1, or a tree's upstream one,
    6.12): the same package version, else the same upstream release, else
    the series' newest; None for tiny.  A series the catalog has no image
    of is refused in one line; nothing is fetched."""
    check_name(name)
    flavour = NAMES[name]
    if flavour is None:
        return None
    wanted, series = versions.upstream(version), versions.series_of(version)
    found = [e for e in catalog.entries((apt or catalog.Apt()).catalog())
             if e.flavour == flavour and e.series == series]
    if not found:
        raise MmlabError(f"--config {name}: the Debian catalog has no {series} {flavour} kernel "
                         f"image to take the config of {version} from; give --config tiny")
    same = ([e for e in found if e.package_version == version]
            or [e for e in found if e.upstream == wanted] or found)
    return max(same, key=lambda e: versions.VersionKey(e.package_version))


def start(name: str, entry: catalog.Entry | None, version: str) -> Start:
    """The config `name` starts from: the image `entry`'s, fetched into the
    kernel cache (its kernel is Debian's own of that version) when it is
    not there, with where it came from."""
    if entry is None:
        return Start(name)
    suffix = "" if entry.flavour == "cloud" else f"-{entry.flavour}"
    spec = entry.upstream if specs.SPEC.match(entry.upstream) else entry.series
    k = images.ensure(f"debian:{spec}{suffix}")
    origin = k.source if k.package_version == version else \
        f"{k.source}, not the source's version {version}"
    return Start(name, k.config.read_text(), origin)


def check_fragment(path: Path) -> list[str]:
    """The fragment's lines, each checked; an error names file and line.
    Fragments come last, so one could undo an option the guest needs,
    which `configure` would find only once the build began, as one that
    did not stick."""
    if not path.is_file():
        raise MmlabError(f"{path}: no such config fragment")
    data = path.read_bytes()
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        where = data.count(b"\n", 0, exc.start) + 1
        raise MmlabError(f"{path}: not a text file (UTF-8): byte {data[exc.start]:#x} at offset "
                         f"{exc.start}, line {where}") from exc
    lines = []
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or (line.startswith("#") and not line.startswith("# CONFIG_")):
            continue
        if not FRAGMENT_LINE.match(line):
            raise MmlabError(f"{path}:{no}: not a config line: {raw!r} "
                             "(expected CONFIG_NAME=value or '# CONFIG_NAME is not set')")
        if (name := _name(line)) in BASE_OPTIONS and line != f"{name}=y":
            raise MmlabError(f"{path}:{no}: {line}: the guest needs {name}=y (mmlab's base "
                             "fragment)")
        lines.append(line)
    return lines


def symbols(tree: Path, files: list[Path] | None = None) -> set[str]:
    """Every CONFIG_ symbol the tree's Kconfig files (or `files`) define."""
    found: set[str] = set()
    for f in files if files is not None else tree.rglob("Kconfig*"):
        try:
            found.update(DEFINED.findall(f.read_text(errors="replace")))
        except OSError:
            continue
    return {f"CONFIG_{s}" for s in found}


def check_known(tree: Path, fragments: list[Path], patches: list[Path]) -> None:
    """Refuse a fragment's =y that neither the tree's Kconfig files nor the
    patches' added lines define (a typo): `configure` would refuse it as
    not sticking, but only once Debian's image is fetched and the base
    tree copied and configured.  One line naming the file, line and
    option, before either."""
    if not fragments:
        return
    known = symbols(tree) | {f"CONFIG_{s}" for p in patches
                             for s in ADDED.findall(p.read_text(errors="replace"))}
    for f in fragments:
        for no, line in enumerate(f.read_text().splitlines(), 1):
            m = YES.match(line.strip())
            if m and m.group(1) not in known:
                raise MmlabError(f"{f}:{no}: {m.group(1)}: no Kconfig file of {tree} defines "
                                 "it, nor any patch given")


def configure(tree: Path, fragments: list[Path], begin: Start) -> None:
    """Debian's config (or tinyconfig), debug info off (Debian's only),
    BASE_FRAGMENT and the user's fragments merged in, then olddefconfig.
    A base option this tree does not define (PROC_SYSCTL is gone in 7.x:
    /proc/sys is always there) is left out; every other requested =y must
    stick."""
    known = symbols(tree)
    wanted = [line for line in BASE_FRAGMENT.splitlines() if _name(line) in known]
    for f in fragments:
        wanted += check_fragment(f)
    if begin.text:
        (tree / ".config").write_text(begin.text)
        changes = [line for line in NO_DEBUG_INFO.splitlines() if _name(line) in known] + wanted
    else:
        run(["make", "-s", "tinyconfig"], cwd=tree, what="make tinyconfig")
        changes = wanted
    merged = tree / ".mmlab-fragment"
    merged.write_text("\n".join(changes) + "\n")
    run(["scripts/kconfig/merge_config.sh", "-m", ".config", str(merged)], cwd=tree,
        what="merge_config.sh")
    run(["make", "-s", "olddefconfig"], cwd=tree, what="make olddefconfig")
    final = images.settings((tree / ".config").read_text())
    for line in wanted:
        m = YES.match(line)
        if m and final.get(m.group(1)) != "y":
            raise MmlabError(f"config: {m.group(1)}=y did not stick in the final config "
                             "(unknown option or an unmet dependency)")


def _name(line: str) -> str:
    """The option a config line sets ("" for any other line)."""
    m = images.SETTING.match(line)
    return (m.group(1) or m.group(3)) if m else ""


def compare(begin: Start, final_text: str, tree: Path) -> dict:
    """How the final config stands to Debian's: the modules built in and
    the options turned on for the guest, and each checked option (mm's,
    preemption, HZ, memcg, NUMA, debug) whose value is not Debian's."""
    if not begin.text:
        return {"name": begin.name, "line": "tiny (tinyconfig and the guest's options)"}
    debian, final = images.settings(begin.text), images.settings(final_text)
    checked = symbols(tree, [tree / f for f in CHECKED_KCONFIGS]) | {f"CONFIG_{o}"
                                                                     for o in CHECKED}
    built_in = sorted(o for o, v in debian.items() if v == "m" and final.get(o) == "y")
    turned_on = sorted(o for o in map(_name, BASE_FRAGMENT.splitlines())
                       if debian.get(o, "n") == "n" and final.get(o) == "y")
    compared = sorted(o for o in checked & set(debian) if not LEFT_OUT.search(o))
    not_kept = [f"{o}={debian[o]} (now {final.get(o, 'n')})" for o in compared
                if debian[o] != final.get(o, "n") and o not in built_in]
    parts = [f"Debian's config, from {begin.origin}"]
    compiler, features = _compiler(debian, final)
    if compiler:
        parts.append(compiler)
    if built_in:
        parts.append(f"built in for the guest: {_short(built_in)}")
    if turned_on:
        parts.append(f"turned on for the guest: {_short(turned_on)}")
    parts.append(f"not as Debian's: {', '.join(not_kept)}" if not_kept else
                 f"its {len(compared)} mm, preemption, HZ and debug options "
                 "as Debian's")
    line = f"{begin.name} ({'; '.join(parts)})"
    return {"name": begin.name, "origin": begin.origin, "built_in": built_in,
            "turned_on": turned_on, "not_kept": not_kept, "compiler": compiler,
            "compiler_features": features, "line": line}


def _compiler(debian: dict[str, str], final: dict[str, str]) -> tuple[str, list[str]]:
    """Debian's compiler when it is not this machine's, and the compiler
    features Kconfig found in one and not the other (code using them differs)."""
    theirs, ours = (c.get("CONFIG_CC_VERSION_TEXT", "?").strip('"') for c in (debian, final))
    features = sorted(o for o in set(debian) | set(final) if o.startswith("CONFIG_CC_HAS_")
                      and debian.get(o, "n") != final.get(o, "n"))
    if theirs == ours:
        return "", features
    return (f"Debian's compiler: {theirs}"
            + (f", {len(features)} of Kconfig's compiler features differ here" if features
               else "")), features


def _short(names: list[str]) -> str:
    return ", ".join(n.removeprefix("CONFIG_") for n in names)
