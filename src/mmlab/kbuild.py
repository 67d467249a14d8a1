"""Kernels built from source, with patches and config fragments, cached.

SOURCE is `debian-source:6.12` (the linux-source package, installed with apt
and unpacked once into the cache) or a path to a kernel tree.  Each build
works in a hard-linked copy of the pristine tree (GNU patch replaces the
files it changes, so the pristine tree is never touched), starts from
tinyconfig plus BASE_FRAGMENT (what the workloads, the QEMU target and the
in-guest tracing need: madvise, /proc/sys, smaps/pagemap, THP, KSM, swap,
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

from . import kernels
from .errors import MmlabError

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
"""

FRAGMENT_LINE = re.compile(r'^(CONFIG_[A-Za-z0-9_]+)=(y|m|n|-?\d+|0x[0-9a-fA-F]+|"[^"]*")$'
                           r'|^# (CONFIG_[A-Za-z0-9_]+) is not set$')


def build_cache() -> Path:
    return kernels.cache_dir().parent / "builds"


def _run(argv: list[str], cwd: Path | None = None, what: str = "") -> str:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise MmlabError(f"{what or argv[0]} failed: {' | '.join(tail)}")
    return proc.stdout


def source_tree(spec: str) -> tuple[Path, str]:
    """(pristine tree, a version string naming it) for `spec`."""
    if spec.startswith("debian-source:"):
        series = spec.removeprefix("debian-source:")
        if not re.fullmatch(r"\d+\.\d+", series):
            raise MmlabError(f"{spec}: expected debian-source:MAJOR.MINOR, e.g. debian-source:6.12")
        pkg = f"linux-source-{series}"
        tarball = Path(f"/usr/src/{pkg}.tar.xz")
        if not tarball.exists():
            _run(["apt-get", "install", "-y", "-qq", pkg], what=f"apt-get install {pkg}")
        version = _run(["dpkg-query", "-W", "-f=${Version}", pkg]).strip()
        tree = kernels.cache_dir().parent / "src" / f"{pkg}_{version}"
        if not (tree / ".mmlab-unpacked").exists():
            tree.parent.mkdir(parents=True, exist_ok=True)
            tmp = tree.with_name(tree.name + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            with tarfile.open(tarball) as t:
                t.extractall(tmp, filter="fully_trusted")
            shutil.rmtree(tree, ignore_errors=True)
            (tmp / pkg).rename(tree)
            shutil.rmtree(tmp)
            (tree / ".mmlab-unpacked").touch()
        return tree, f"{spec} {version}"
    tree = Path(spec).resolve()
    if not (tree / "Makefile").is_file() or not (tree / "Kconfig").is_file():
        raise MmlabError(f"{spec}: not a kernel source tree (no Makefile and Kconfig)")
    head = subprocess.run(["git", "-C", str(tree), "describe", "--always", "--dirty"],
                          capture_output=True, text=True)
    return tree, f"{tree} {head.stdout.strip() or 'no git'}"


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
    dry = subprocess.run(["patch", "-p1", "--dry-run", "--batch", "-d", str(tree), "-i",
                          str(patch.resolve())], capture_output=True, text=True)
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


def configure(tree: Path, fragments: list[Path]) -> None:
    wanted = BASE_FRAGMENT.splitlines()
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
          name: str | None = None, on_line: Callable[[str], None] | None = None) -> kernels.Kernel:
    patches, fragments = list(patches or []), list(fragments or [])
    for f in fragments:
        check_fragment(f)
    tree, source_id = source_tree(spec)
    key = build_key(source_id, patches, fragments)
    kname = f"build:{name or key[:12]}"
    for k in kernels.cached():
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
                   "patches": [{"file": str(p), "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                               for p in patches],
                   "fragments": [str(f) for f in fragments]}
        k = kernels.store(kname, release, f"{source_id}" + "".join(f" + {p.name}" for p in patches),
                          copy / "arch/x86/boot/bzImage", copy / ".config", details=details)
        shutil.copyfile(log, Path(k.dir) / "build.log")
        return k
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def _make(tree: Path, log: Path, on_line: Callable[[str], None] | None) -> None:
    jobs = str(os.cpu_count() or 1)
    with open(log, "w") as out:
        proc = subprocess.Popen(["make", f"-j{jobs}", "bzImage"], cwd=tree, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if on_line:
                on_line(line.rstrip())
        rc = proc.wait()
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
