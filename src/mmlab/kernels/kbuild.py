"""Kernels built from source, with patches and config fragments, cached.

SOURCE is `debian-source:7.3` (the newest linux-source-7.3 package of any
suite, fetched with mmlab's own apt and unpacked once into the cache; nothing
is installed on the host) or a path to a kernel tree.  Each build
works in a hard-linked copy of the pristine tree (GNU patch replaces the
files it changes, so the pristine tree is never touched), starts from
tinyconfig plus BASE_FRAGMENT (what the workloads, the QEMU target and the
in-guest tracing need: madvise, /proc/sys, smaps/pagemap, THP, KSM, swap,
zram and a virtio disk for guest swap, NUMA from ACPI for `numa_nodes`,
compaction, kprobes, hist triggers, function_graph, ACPI power-off), adds the
user's fragments, and checks that every requested option really ended up in
the final config.  The result is cached under a key hashed from the source
version, the patches and the fragments; the final config's hash is recorded
with it.  A second request with the same inputs is a cache hit.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.kernels import catalog, images, versions
from mmlab.machine import paths, proc

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

FRAGMENT_LINE = re.compile(r'^(CONFIG_[A-Za-z0-9_]+)=(y|m|n|-?\d+|0x[0-9a-fA-F]+|"[^"]*")$'
                           r'|^# (CONFIG_[A-Za-z0-9_]+) is not set$')


def build_cache() -> Path:
    return paths.cache_root() / "builds"


def _run(argv: list[str], cwd: Path | None = None, what: str = "") -> str:
    return proc.call(argv, cwd=cwd, what=what or argv[0]).stdout


def source_tree(spec: str) -> tuple[Path, str]:
    """(pristine tree, a version string naming it) for `spec`."""
    if spec.startswith("debian-source:"):
        series = spec.removeprefix("debian-source:")
        if not re.fullmatch(r"\d+\.\d+", series):
            raise MmlabError(f"{spec}: expected debian-source:MAJOR.MINOR, e.g. debian-source:7.3")
        pkg, version, suite = debian_source(series)
        tree = paths.cache_root() / "src" / f"{pkg}_{version}"
        if not (tree / ".mmlab-unpacked").exists():
            _unpack_source(pkg, version, tree)
        return tree, f"{spec} {version}"
    tree = Path(spec).resolve()
    if not (tree / "Makefile").is_file() or not (tree / "Kconfig").is_file():
        raise MmlabError(f"{spec}: not a kernel source tree (no Makefile and Kconfig)")
    head = proc.call(["git", "-C", str(tree), "describe", "--always", "--dirty"], check=False)
    return tree, f"{tree} {head.stdout.strip() or 'no git'}"


def debian_source(series: str, apt: catalog.Apt | None = None) -> tuple[str, str, str]:
    """(package, newest version, suite) of linux-source-SERIES in the catalog."""
    apt = apt or catalog.Apt()
    pkg = f"linux-source-{series}"
    rows = [r for r in apt.catalog() if r["package"] == pkg]
    if not rows:
        have = sorted({r["package"].removeprefix("linux-source-") for r in apt.catalog()
                       if r["package"].startswith("linux-source-")}, key=versions.series_key)
        raise MmlabError(f"debian-source:{series}: the Debian catalog has no {pkg} (sources it "
                         f"has: {', '.join(have) or 'none'})")
    best = max(rows, key=lambda r: versions.VersionKey(r["version"]))
    return pkg, best["version"], best["suite"]


def _unpack_source(pkg: str, version: str, tree: Path) -> None:
    """apt-get download the source package with mmlab's apt (nothing is
    installed on the host) and unpack its tarball as `tree`, once."""
    apt = catalog.Apt()
    tree.parent.mkdir(parents=True, exist_ok=True)
    tmp = tree.with_name(tree.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        apt.call("apt-get", "download", f"{pkg}={version}", cwd=tmp,
                 what=f"apt-get download {pkg}={version}")
        (deb,) = tmp.glob("*.deb")
        _run(["dpkg-deb", "-x", str(deb), str(tmp / "x")], what=f"dpkg-deb -x {deb.name}")
        deb.unlink()
        tarballs = list((tmp / "x/usr/src").glob(f"{pkg}.tar.*"))
        if not tarballs:
            raise MmlabError(f"{pkg} {version}: no /usr/src/{pkg}.tar.* in the package")
        with tarfile.open(tarballs[0]) as t:
            t.extractall(tmp / "src", filter="fully_trusted")
        shutil.rmtree(tree, ignore_errors=True)
        (tmp / "src" / pkg).rename(tree)
        (tree / ".mmlab-unpacked").touch()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_fragment(path: Path) -> list[str]:
    """The fragment's lines, each checked; an error names file and line."""
    if not path.is_file():
        raise MmlabError(f"{path}: no such config fragment")
    lines = []
    for no, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or (line.startswith("#") and not line.startswith("# CONFIG_")):
            continue
        if not FRAGMENT_LINE.match(line):
            raise MmlabError(f"{path}:{no}: not a config line: {raw!r} "
                             "(expected CONFIG_NAME=value or '# CONFIG_NAME is not set')")
        lines.append(line)
    return lines


def build_key(source_id: str, patches: list[Path], fragments: list[Path]) -> str:
    h = hashlib.sha256()
    h.update(source_id.encode())
    h.update(BASE_FRAGMENT.encode())
    for p in patches:
        h.update(b"patch\0" + p.read_bytes())
    for f in fragments:
        h.update(b"fragment\0" + f.read_bytes())
    return h.hexdigest()


def apply_patch(tree: Path, patch: Path) -> None:
    """Dry run first; a patch that does not apply names its file and hunk."""
    if not patch.is_file():
        raise MmlabError(f"{patch}: no such patch")
    dry = proc.call(["patch", "-p1", "--dry-run", "--batch", "-d", str(tree), "-i",
                    str(patch.resolve())], check=False)
    if dry.returncode:
        current, failed = "?", []
        for line in dry.stdout.splitlines():
            m = re.match(r"(?:checking|patching) file (\S+)", line)
            if m:
                current = m.group(1)
            if "FAILED" in line or "can't find file" in line or "No file to patch" in line:
                failed.append(f"{current}: {line.strip()}")
        raise MmlabError(f"patch {patch} does not apply: "
                         f"{'; '.join(failed) or dry.stdout.strip().splitlines()[-1:]}")
    _run(["patch", "-p1", "--batch", "--quiet", "-d", str(tree), "-i", str(patch.resolve())],
         what=f"patch {patch}")


def kconfig_symbols(tree: Path) -> set[str]:
    """Every CONFIG_ symbol the tree's Kconfig files define."""
    found: set[str] = set()
    for f in tree.rglob("Kconfig*"):
        try:
            found.update(re.findall(r"^\s*(?:menu)?config\s+(\w+)", f.read_text(errors="replace"),
                                    re.M))
        except OSError:
            continue
    return {f"CONFIG_{s}" for s in found}


def configure(tree: Path, fragments: list[Path]) -> None:
    """tinyconfig + BASE_FRAGMENT + the user's fragments.  A base option this
    tree does not define (PROC_SYSCTL is gone in 7.x: /proc/sys is always
    there) is left out; every other requested =y must stick."""
    known = kconfig_symbols(tree)
    wanted = [line for line in BASE_FRAGMENT.splitlines() if line.split("=")[0] in known]
    for f in fragments:
        wanted += check_fragment(f)
    _run(["make", "-s", "tinyconfig"], cwd=tree, what="make tinyconfig")
    merged = tree / ".mmlab-fragment"
    merged.write_text("\n".join(wanted) + "\n")
    _run(["scripts/kconfig/merge_config.sh", "-m", ".config", str(merged)], cwd=tree,
         what="merge_config.sh")
    _run(["make", "-s", "olddefconfig"], cwd=tree, what="make olddefconfig")
    final = (tree / ".config").read_text()
    for line in wanted:
        m = re.match(r"^(CONFIG_\w+)=y$", line)
        if m and f"{m.group(1)}=y" not in final.splitlines():
            raise MmlabError(f"config: {m.group(1)}=y did not stick in the final config "
                             "(unknown option or an unmet dependency)")


def build(spec: str, patches: list[Path] | None = None, fragments: list[Path] | None = None,
          name: str | None = None, on_line: Callable[[str], None] | None = None) -> images.Kernel:
    patches, fragments = list(patches or []), list(fragments or [])
    for f in fragments:
        check_fragment(f)
    tree, source_id = source_tree(spec)
    key = build_key(source_id, patches, fragments)
    kname = f"build:{name or key[:12]}"
    for k in images.cached():
        if k.details.get("build_key") == key:
            return k
    work = build_cache() / key[:16]
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    copy = work / "tree"
    _run(["cp", "-al", str(tree), str(copy)], what="hard-linked copy of the source")
    try:
        for p in patches:
            apply_patch(copy, p)
        configure(copy, fragments)
        log = work / "build.log"
        _make(copy, log, on_line)
        release = _run(["make", "-s", "kernelrelease"], cwd=copy).strip()
        details = {"build_key": key, "source": source_id,
                   "patches": [{"file": str(p),
                                "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                               for p in patches],
                   "fragments": [str(f) for f in fragments]}
        k = images.store(kname, release, f"{source_id}" + "".join(f" + {p.name}" for p in patches),
                          copy / "arch/x86/boot/bzImage", copy / ".config", details=details)
        shutil.copyfile(log, Path(k.dir) / "build.log")
        k.keep_symbols((copy / "System.map").read_bytes())
        return k
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def _make(tree: Path, log: Path, on_line: Callable[[str], None] | None) -> None:
    jobs = str(os.cpu_count() or 1)
    with open(log, "w") as out:
        make = subprocess.Popen(["make", f"-j{jobs}", "bzImage"], cwd=tree, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        assert make.stdout is not None
        for line in make.stdout:
            out.write(line)
            if on_line:
                on_line(line.rstrip())
        rc = make.wait()
    if rc:
        tail = log.read_text().strip().splitlines()[-8:]
        raise MmlabError(f"kernel build failed (log {log}): " + " | ".join(tail))



def commits(tree: Path, rev_range: str) -> list[str]:
    """'A..B' in a git tree -> [A, ..., B], oldest first (first-parent order)."""
    if ".." not in rev_range:
        raise MmlabError(f"--commits {rev_range!r}: expected OLD..NEW")
    old = rev_range.split("..", 1)[0]
    base = _run(["git", "-C", str(tree), "rev-parse", "--verify", f"{old}^{{commit}}"],
                what=f"git rev-parse {old}").strip()
    rest = _run(["git", "-C", str(tree), "rev-list", "--reverse", "--first-parent", rev_range],
                what=f"git rev-list {rev_range}").split()
    if not rest:
        raise MmlabError(f"--commits {rev_range}: no commits in that range")
    return [base, *rest]


def checkout(tree: Path, commit: str) -> Path:
    """A detached git worktree of `commit`, made once, in the cache."""
    dest = build_cache() / "worktrees" / commit
    if not (dest / "Makefile").exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(dest, ignore_errors=True)
        _run(["git", "-C", str(tree), "worktree", "add", "--detach", "--force", str(dest),
              commit], what=f"git worktree add {commit[:12]}")
    return dest


def ab_pair(spec: str, patches: list[Path], fragments: list[Path],
            on_line: Callable[[str], None] | None = None) -> tuple[images.Kernel, images.Kernel]:
    """A (unpatched) and B (patched) from the same source and fragments.
    Every patch is checked first, in order, in a scratch copy of the tree,
    so one that is missing or does not apply fails before minutes of
    building A."""
    for p in patches:
        if not p.is_file():
            raise MmlabError(f"--patch {p}: no such file")
    for f in fragments:
        check_fragment(f)
    tree, _ = source_tree(spec)
    scratch = build_cache() / "patch-check"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.parent.mkdir(parents=True, exist_ok=True)
    _run(["cp", "-al", str(tree), str(scratch)], what="hard-linked copy of the source")
    try:
        for p in patches:
            apply_patch(scratch, p)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return (build(spec, [], fragments, None, on_line),
            build(spec, patches, fragments, None, on_line))


def commit_kernels(tree: Path, rev_range: str, fragments: list[Path]
                   ) -> tuple[list[str], Callable[[str, Callable[[str], None] | None], None]]:
    """The kernel names of the commits OLD..NEW (`build:<sha12>`, oldest
    first) and `ensure(name, on_line)`, which builds one the first time a
    search needs it.  The tree is checked to be a kernel git tree before
    anything, so nothing is added to a repository that is not one."""
    tree = tree.resolve()
    if not (tree / "Makefile").is_file() or not (tree / "Kconfig").is_file():
        raise MmlabError(f"--source {tree}: not a kernel source tree (no Makefile and Kconfig)")
    inside = proc.call(["git", "-C", str(tree), "rev-parse", "--is-inside-work-tree"], check=False)
    if inside.returncode or inside.stdout.strip() != "true":
        raise MmlabError(f"--source {tree}: not a git tree (--commits needs one)")
    for f in fragments:
        check_fragment(f)
    shas = commits(tree, rev_range)
    by_name = {f"build:{c[:12]}": c for c in shas}

    def ensure(name: str, on_line: Callable[[str], None] | None = None) -> None:
        build(str(checkout(tree, by_name[name])), [], fragments, name.removeprefix("build:"),
              on_line)
    return list(by_name), ensure
