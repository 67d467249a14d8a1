"""Kernels built from source, with patches and config fragments, cached.

SOURCE is `debian-source:7.3` (the newest linux-source-7.3 package of any
suite, fetched with mmlab's own apt and unpacked once into the cache; nothing
is installed on the host) or a path to a kernel tree.  A base (a source
and its fragments, no patch) is built once in a hard-linked copy of the
pristine tree (GNU patch replaces the files it changes, so the pristine tree
is never touched) and that tree is kept; a patched kernel is an incremental
rebuild of a copy of it (copy_base says how make is kept from rebuilding
everything), and a series is applied patch by patch, each build reusing the
previous one's tree.  The base's config is Debian's for that release, or
tinyconfig, with what the guest needs built in and the user's fragments
(kconfig.py).  The result is cached under a key hashed from the source
version, the config's start (Debian's config itself), the patches and the
fragments; the final config's hash, and how it stands to Debian's, are
recorded with it.  A second request with the same inputs is a cache hit.
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
from dataclasses import dataclass
from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.kernels import catalog, images, kconfig, series, versions
from mmlab.machine import paths, proc


def build_cache() -> Path:
    return paths.cache_root() / "builds"


@dataclass(frozen=True)
class Recipe:
    """What every kernel of one build request shares besides its patches:
    the source (as its version names it), the config's start, the fragments."""
    source_id: str
    begin: kconfig.Start
    fragments: list[Path]


def source_tree(spec: str) -> tuple[Path, str]:
    """(pristine tree, a version string naming it) for `spec`."""
    if spec.startswith("debian-source:"):
        pkg, version, suite = debian_source(_series(spec))
        tree = paths.cache_root() / "src" / f"{pkg}_{version}"
        if not (tree / ".mmlab-unpacked").exists():
            _unpack_source(pkg, version, tree)
        return tree, f"{spec} {version}"
    tree = _tree(spec)
    head = proc.call(["git", "-C", str(tree), "describe", "--always", "--dirty"], check=False)
    return tree, f"{tree} {head.stdout.strip() or 'no git'}"


def _series(spec: str) -> str:
    series = spec.removeprefix("debian-source:")
    if not re.fullmatch(r"\d+\.\d+", series):
        raise MmlabError(f"{spec}: expected debian-source:MAJOR.MINOR, e.g. debian-source:7.3")
    return series


def _tree(spec: str) -> Path:
    tree = Path(spec).resolve()
    if not (tree / "Makefile").is_file() or not (tree / "Kconfig").is_file():
        raise MmlabError(f"{spec}: not a kernel source tree (no Makefile and Kconfig)")
    return tree


def config_image(config: str, spec: str) -> tuple[catalog.Entry | None, str]:
    """(the Debian image whose config `config` starts from, the source's
    version) for SOURCE `spec`, checked in one line before anything is
    fetched or built: an unknown config name, a source the catalog lacks, a
    series it has no image of."""
    kconfig.check_name(config)
    if kconfig.NAMES[config] is None:
        return None, ""
    version = (debian_source(_series(spec))[1] if spec.startswith("debian-source:")
               else kconfig.tree_release(_tree(spec)))
    return kconfig.image(config, version), version


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
        kconfig.run(["dpkg-deb", "-x", str(deb), str(tmp / "x")], what=f"dpkg-deb -x {deb.name}")
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


def build_key(recipe: Recipe, patches: list[Path]) -> str:
    h = hashlib.sha256()
    h.update(recipe.source_id.encode())
    h.update(kconfig.BASE_FRAGMENT.encode())
    h.update(recipe.begin.key())
    for p in patches:
        h.update(b"patch\0" + p.read_bytes())
    for f in recipe.fragments:
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
    kconfig.run(["patch", "-p1", "--batch", "--quiet", "-d", str(tree), "-i",
                 str(patch.resolve())], what=f"patch {patch}")


def build(spec: str, patches: list[Path] | None = None, fragments: list[Path] | None = None,
          name: str | None = None, on_line: Callable[[str], None] | None = None,
          config: str = kconfig.DEFAULT) -> images.Kernel:
    """The kernel of `spec` with `patches`: an incremental build on the
    base's kept tree (see build_series), the patches between not built."""
    return build_series(spec, list(patches or []), list(fragments or []), name, on_line,
                        every=False, config=config)[-1]


def build_series(spec: str, patches: list[Path], fragments: list[Path], name: str | None = None,
                 on_line: Callable[[str], None] | None = None, every: bool = True,
                 config: str = kconfig.DEFAULT) -> list[images.Kernel]:
    """[base, base + patch 1, ..., base + every patch]: the base is built once
    and its tree kept; the patches are applied one by one to a copy of it,
    each an incremental build of the tree the one before left (make rebuilds
    the objects a patch changed, and the link).  A kernel already cached is
    not built again; `name` names the last one.  With `every` false only the
    base and the last are built (and returned).  `config`: kconfig's name
    of where the config starts (Debian's image for it is fetched once).
    Every input is checked before anything is fetched for the next: a
    Debian source's config in the catalog before the source is fetched,
    the patches before Debian's image is."""
    for p in patches:
        if not p.is_file():
            raise MmlabError(f"--patch {p}: no such file")
    for f in fragments:
        kconfig.check_fragment(f)
    kconfig.check_name(config)
    debian = spec.startswith("debian-source:")
    image, version = config_image(config, spec) if debian else (None, "")
    tree, source_id = source_tree(spec)
    check_applies(tree, patches)
    kconfig.check_known(tree, fragments, patches)
    if not debian:
        image, version = config_image(config, spec)
    recipe = Recipe(source_id, kconfig.start(config, image, version), fragments)
    keys: list[str | None] = [build_key(recipe, patches[:i]) for i in range(len(patches) + 1)]
    names = [f"build:{str(k)[:12]}" for k in keys[:-1]] + [f"build:{name or str(keys[-1])[:12]}"]
    if not every:
        keys[1:-1] = [None] * (len(keys) - 2)
    found = {k.details.get("build_key"): k for k in images.cached()}
    if all(k in found for k in keys if k):
        return [found[k] for k in keys if k]
    base = kept_base(tree, recipe, str(keys[0]), on_line)
    kernels = [found.get(keys[0]) or _register(base / "tree", names[0], str(keys[0]), recipe, [],
                                               base / "build.log")]
    if not patches:
        return kernels
    work = build_cache() / str(keys[-1])[:16]
    with paths.filling(work):
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        copy = work / "tree"
        copy_base(base, copy)
        try:
            kernels += _build_on(copy, patches, recipe, list(zip(keys[1:], names[1:])),
                                 found, on_line)
        finally:
            shutil.rmtree(copy, ignore_errors=True)
    return kernels


def _build_on(tree: Path, patches: list[Path], recipe: Recipe,
              wanted: list[tuple[str | None, str]], found: dict,
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
            kconfig.configure(tree, recipe.fragments, recipe.begin)
            reconfigure = False
        log = tree.parent / "build.log"
        _make(tree, log, on_line)
        kernels.append(_register(tree, kname, key, recipe, patches[:i], log))
    return kernels


def kept_base(tree: Path, recipe: Recipe, key: str,
              on_line: Callable[[str], None] | None = None) -> Path:
    """The folder of the base's kept build: `tree` (a hard-linked copy of the
    pristine source, configured and built) and `outputs`, the files the
    build made (written last: a folder without it is not built yet).  A
    build cut short (killed, or failed) resumes where it stopped once its
    tree was configured (`configured`, written then): Kbuild remakes every
    target whose saved command, written after the target, is missing, and
    make removes a target it was making when it is stopped."""
    base = base_dir(key)
    with paths.filling(base):
        if (base / "outputs").is_file():
            return base
        if not (base / "configured").is_file():
            shutil.rmtree(base, ignore_errors=True)
            base.mkdir(parents=True)
            kconfig.run(["cp", "-al", str(tree), str(base / "tree")],
                        what="hard-linked copy of the source")
            kconfig.configure(base / "tree", recipe.fragments, recipe.begin)
            (base / "configured").touch()
        _make(base / "tree", base / "build.log", on_line, resume=True)
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
    kconfig.run(["cp", "-al", str(base / "tree"), str(dest)], what="hard-linked copy of the base")
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


def _register(tree: Path, kname: str, key: str, recipe: Recipe, patches: list[Path],
              log: Path) -> images.Kernel:
    """Store a built tree's image under `kname`, with its inputs, its
    config's start and how the config stands to it, compiler and log."""
    release = kconfig.run(["make", "-s", "kernelrelease"], cwd=tree).strip()
    took = re.findall(r"^mmlab: make took ([\d.]+) s$", log.read_text(), re.M)   # one a run
    config = kconfig.compare(recipe.begin, (tree / ".config").read_text(), tree)
    details = {"build_key": key, "source": recipe.source_id, "compiler": compiler(tree),
               "make_s": sum(map(float, took)) if took else None,
               "patches": [{"file": str(p), "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                           for p in patches],
               "fragments": [str(f) for f in recipe.fragments],
               "config": config.pop("line"), "config_start": config}
    k = images.store(kname, release,
                     recipe.source_id + "".join(f" + {p.name}" for p in patches),
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


def _make(tree: Path, log: Path, on_line: Callable[[str], None] | None,
          resume: bool = False) -> None:
    """make bzImage with every core; the log, and the seconds it took as its
    last line (what a report says of where a check's time went).  With
    `resume`, a log already there (a build cut short) is added to."""
    jobs, start = str(os.cpu_count() or 1), time.monotonic()
    again = resume and log.is_file() and log.stat().st_size > 0
    with open(log, "a" if again else "w") as out:
        if again:
            out.write("mmlab: make resumed\n")
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
    base = kconfig.run(["git", "-C", str(tree), "rev-parse", "--verify", f"{old}^{{commit}}"],
                       what=f"git rev-parse {old}").strip()
    rest = kconfig.run(["git", "-C", str(tree), "rev-list", "--reverse", "--first-parent",
                        rev_range], what=f"git rev-list {rev_range}").split()
    if not rest:
        raise MmlabError(f"--commits {rev_range}: no commits in that range")
    return [base, *rest]


def checkout(tree: Path, commit: str) -> Path:
    """A detached git worktree of `commit`, made once, in the cache."""
    dest = build_cache() / "worktrees" / commit
    if not (dest / "Makefile").exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(dest, ignore_errors=True)
        kconfig.run(["git", "-C", str(tree), "worktree", "add", "--detach", "--force",
                     str(dest), commit], what=f"git worktree add {commit[:12]}")
    return dest


def ab_pair(spec: str, patches: list[Path], fragments: list[Path],
            on_line: Callable[[str], None] | None = None,
            config: str = kconfig.DEFAULT) -> tuple[images.Kernel, images.Kernel]:
    """A (unpatched) and B (patched) from the same source, config and fragments.
    B is an incremental build on A's kept tree; every patch is checked
    first (check_applies), so one that is missing or does not apply fails
    before minutes of building A."""
    if not patches:
        raise MmlabError("ab: no --patch given (B is A with the patches)")
    a, *_, b = build_series(spec, patches, fragments, None, on_line, every=False, config=config)
    return a, b


def commit_kernels(tree: Path, rev_range: str, fragments: list[Path],
                   config: str = kconfig.DEFAULT
                   ) -> tuple[list[str], Callable[[str, Callable[[str], None] | None], None]]:
    """The kernel names of the commits OLD..NEW (`build:<sha12>`, oldest
    first) and `ensure(name, on_line)`, which builds one the first time a
    search needs it.  The tree is checked to be a kernel git tree before
    anything, so nothing is added to a repository that is not one.  A
    commit's built tree is not kept: each commit is a base of its own, used
    once.  The config is checked against the tree as it is now (each
    commit's build takes the Debian image of its own release)."""
    tree = tree.resolve()
    if not (tree / "Makefile").is_file() or not (tree / "Kconfig").is_file():
        raise MmlabError(f"--source {tree}: not a kernel source tree (no Makefile and Kconfig)")
    inside = proc.call(["git", "-C", str(tree), "rev-parse", "--is-inside-work-tree"], check=False)
    if inside.returncode or inside.stdout.strip() != "true":
        raise MmlabError(f"--source {tree}: not a git tree (--commits needs one)")
    for f in fragments:
        kconfig.check_fragment(f)
    config_image(config, str(tree))
    shas = commits(tree, rev_range)
    by_name = {f"build:{c[:12]}": c for c in shas}

    def ensure(name: str, on_line: Callable[[str], None] | None = None) -> None:
        k = build(str(checkout(tree, by_name[name])), [], fragments, name.removeprefix("build:"),
                  on_line, config)
        shutil.rmtree(base_dir(k.details["build_key"]), ignore_errors=True)
    return list(by_name), ensure
