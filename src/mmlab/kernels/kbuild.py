"""Kernels built from source, with patches and config fragments, cached.

SOURCE is `debian-source:7.3` (the newest linux-source-7.3 package of any
suite, fetched with mmlab's own apt and unpacked once into the cache; nothing
is installed on the host) or a path to a kernel tree.  A base (a source
and its fragments, no patch) is built once in a hard-linked copy of the
pristine tree (GNU patch replaces the files it changes, so the pristine tree
is never touched) and that tree is kept; a patched kernel is an incremental
rebuild of a copy of it (copy_base says how make is kept from rebuilding
everything), and a series is applied patch by patch, each build reusing the
previous one's tree.  The base starts from
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
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.kernels import catalog, images, series, versions
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
    """The kernel of `spec` with `patches`: an incremental build on the
    base's kept tree (see build_series), the patches between not built."""
    return build_series(spec, list(patches or []), list(fragments or []), name, on_line,
                        every=False)[-1]


def build_series(spec: str, patches: list[Path], fragments: list[Path], name: str | None = None,
                 on_line: Callable[[str], None] | None = None,
                 every: bool = True) -> list[images.Kernel]:
    """[base, base + patch 1, ..., base + every patch]: the base is built once
    and its tree kept; the patches are applied one by one to a copy of it,
    each an incremental build of the tree the one before left (make rebuilds
    the objects a patch changed, and the link).  A kernel already cached is
    not built again; `name` names the last one.  With `every` false only the
    base and the last are built (and returned)."""
    for p in patches:
        if not p.is_file():
            raise MmlabError(f"--patch {p}: no such file")
    for f in fragments:
        check_fragment(f)
    tree, source_id = source_tree(spec)
    keys: list[str | None] = [build_key(source_id, patches[:i], fragments)
                              for i in range(len(patches) + 1)]
    names = [f"build:{str(k)[:12]}" for k in keys[:-1]] + [f"build:{name or str(keys[-1])[:12]}"]
    if not every:
        keys[1:-1] = [None] * (len(keys) - 2)
    found = {k.details.get("build_key"): k for k in images.cached()}
    if all(k in found for k in keys if k):
        return [found[k] for k in keys if k]
    check_applies(tree, patches)
    base = kept_base(tree, fragments, str(keys[0]), on_line)
    kernels = [found.get(keys[0]) or _register(base / "tree", names[0], str(keys[0]), source_id,
                                               [], fragments, base / "build.log")]
    if not patches:
        return kernels
    work = build_cache() / str(keys[-1])[:16]
    with paths.filling(work):
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        copy = work / "tree"
        copy_base(base, copy)
        try:
            kernels += _build_on(copy, patches, fragments, list(zip(keys[1:], names[1:])),
                                 found, source_id, on_line)
        finally:
            shutil.rmtree(copy, ignore_errors=True)
    return kernels


def _build_on(tree: Path, patches: list[Path], fragments: list[Path],
              wanted: list[tuple[str | None, str]], found: dict, source_id: str,
              on_line: Callable[[str], None] | None) -> list[images.Kernel]:
    """Apply each patch to `tree` and build the kernels wanted (a key) and
    not `found` yet.  A patch that touches a Kconfig file has the config
    made again (the same fragments and checks) before the next build."""
    kernels, reconfigure = [], False
    for i, (p, (key, kname)) in enumerate(zip(patches, wanted), 1):
        apply_patch(tree, p)
        reconfigure |= any(Path(f).name.startswith("Kconfig")
                           for f in series.paths_in(p.read_text(errors="replace")))
        if key is None or key in found:
            kernels += [found[key]] if key else []
            continue
        if reconfigure:
            configure(tree, fragments)
            reconfigure = False
        log = tree.parent / "build.log"
        _make(tree, log, on_line)
        kernels.append(_register(tree, kname, key, source_id, patches[:i], fragments, log))
    return kernels


def kept_base(tree: Path, fragments: list[Path], key: str,
              on_line: Callable[[str], None] | None = None) -> Path:
    """The folder of the base's kept build: `tree` (a hard-linked copy of the
    pristine source, configured and built) and `outputs`, the files the
    build made (written last: a folder without it is built again)."""
    base = base_dir(key)
    with paths.filling(base):
        if (base / "outputs").is_file():
            return base
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        _run(["cp", "-al", str(tree), str(base / "tree")], what="hard-linked copy of the source")
        configure(base / "tree", fragments)
        _make(base / "tree", base / "build.log", on_line)
        (base / "outputs").write_text("".join(f"{rel}\n" for rel in _made_files(base / "tree")))
    return base


def base_dir(key: str) -> Path:
    return build_cache() / "bases" / key[:16]


def _made_files(tree: Path) -> list[str]:
    """The regular files of a just-built tree that the build made: those
    with one link (every source file is also linked from the pristine tree)."""
    return sorted(os.path.relpath(path, tree) for top, _, files in os.walk(tree)
                  for path in (os.path.join(top, f) for f in files)
                  if stat.S_ISREG((st := os.lstat(path)).st_mode) and st.st_nlink == 1)


def copy_base(base: Path, dest: Path) -> None:
    """A tree to build a patched kernel in: the base's sources hard-linked
    (GNU patch replaces a file it changes, it never writes into it) and the
    base's build outputs copied, because make, the compiler and fixdep
    write into the files they remake.  Every file keeps its modification
    time to the nanosecond, so make sees only what a patch touches (patch
    gives the files it changes the current time) as newer than its objects.
    The kernel's own commands name paths relative to the tree, but objtool
    is built with absolute ones: its saved commands and dependencies (.cmd
    and .d files) name the copy instead, or its changed command line would
    rebuild it, and every object depends on objtool."""
    _run(["cp", "-al", str(base / "tree"), str(dest)], what="hard-linked copy of the base")
    old, new = str(base / "tree").encode(), str(dest).encode()
    for rel in (base / "outputs").read_text().splitlines():
        target = dest / rel
        tmp = target.with_name(target.name + ".mmlab-copy")
        data = (base / "tree" / rel).read_bytes() if rel.endswith((".cmd", ".d")) else b""
        if old in data:
            tmp.write_bytes(data.replace(old, new))
            shutil.copystat(base / "tree" / rel, tmp)
        else:
            shutil.copy2(base / "tree" / rel, tmp)
        os.replace(tmp, target)


def check_applies(tree: Path, patches: list[Path]) -> None:
    """Every patch applied in order to a scratch copy of only the files the
    series names (in the system's temporary folder, removed after), so one
    that is missing or does not apply (a later patch that conflicts with an
    earlier one too) fails before anything is made or built."""
    with tempfile.TemporaryDirectory(prefix="mmlab-patch-check-") as tmp:
        scratch = Path(tmp)
        for p in patches:
            for rel in series.paths_in(p.read_text(errors="replace")):
                if (tree / rel).is_file() and not (scratch / rel).exists():
                    (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(tree / rel, scratch / rel)
        for p in patches:
            apply_patch(scratch, p)


def _register(tree: Path, kname: str, key: str, source_id: str, patches: list[Path],
              fragments: list[Path], log: Path) -> images.Kernel:
    """Store a built tree's image under `kname`, with its inputs, compiler and log."""
    release = _run(["make", "-s", "kernelrelease"], cwd=tree).strip()
    took = re.findall(r"^mmlab: make took ([\d.]+) s$", log.read_text(), re.M)
    details = {"build_key": key, "source": source_id, "compiler": compiler(tree),
               "make_s": float(took[-1]) if took else None,
               "patches": [{"file": str(p), "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                           for p in patches],
               "fragments": [str(f) for f in fragments]}
    k = images.store(kname, release, f"{source_id}" + "".join(f" + {p.name}" for p in patches),
                     tree / "arch/x86/boot/bzImage", tree / ".config", details=details)
    shutil.copyfile(log, Path(k.dir) / "build.log")
    k.keep_symbols((tree / "System.map").read_bytes())
    return k


def compiler(tree: Path) -> str:
    """The compiler and linker a built tree names (include/generated/compile.h)."""
    header = tree / "include/generated/compile.h"
    text = header.read_text(errors="replace") if header.is_file() else ""
    m = re.search(r'^#define LINUX_COMPILER\s+"(.*)"$', text, re.M)
    return m.group(1) if m else "unknown"


def _make(tree: Path, log: Path, on_line: Callable[[str], None] | None) -> None:
    """make bzImage with every core; the log, and the seconds it took as its
    last line (what a report says of where a check's time went)."""
    jobs, start = str(os.cpu_count() or 1), time.monotonic()
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
    with open(log, "a") as out:
        out.write(f"mmlab: make took {time.monotonic() - start:.1f} s\n")


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
    B is an incremental build on A's kept tree; every patch is checked
    first (check_applies), so one that is missing or does not apply fails
    before minutes of building A."""
    if not patches:
        raise MmlabError("ab: no --patch given (B is A with the patches)")
    a, *_, b = build_series(spec, patches, fragments, None, on_line, every=False)
    return a, b


def commit_kernels(tree: Path, rev_range: str, fragments: list[Path]
                   ) -> tuple[list[str], Callable[[str, Callable[[str], None] | None], None]]:
    """The kernel names of the commits OLD..NEW (`build:<sha12>`, oldest
    first) and `ensure(name, on_line)`, which builds one the first time a
    search needs it.  The tree is checked to be a kernel git tree before
    anything, so nothing is added to a repository that is not one.  A
    commit's built tree is not kept: each commit is a base of its own, used
    once."""
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
        k = build(str(checkout(tree, by_name[name])), [], fragments, name.removeprefix("build:"),
                  on_line)
        shutil.rmtree(base_dir(k.details["build_key"]), ignore_errors=True)
    return list(by_name), ensure
