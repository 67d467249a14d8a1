"""The kernel functions a series changes, read from the base's source.

Each patch's hunks are placed in the file as the series has it at that
patch: the base tree's files the series touches are copied to a scratch
folder and the patches applied there one by one, so a later patch's line
numbers are read against the earlier ones'.  A hunk changes the function
whose extent holds one of its removed lines or insertion points; a function
the patch adds is one the file has after it and not before.  Git's
`@@ ... @@ func` hint is not used where the file is there: it names the
function *before* the hunk, which is another one when the hunk opens a
function or lies between two.

Function extents come from universal-ctags (Debian's `universal-ctags`,
maintained upstream; `ctags` reads a C file in milliseconds), as the
kernel's own `make tags` does: its annotations ignored, and SYSCALL_DEFINEn
bodies named as the symbol the compiler gives them (`__do_sys_NAME`).  The
built kernel's line tables (DWARF, through addr2line) would say the same
for compiled code, but the kept base is built without debug info (its
build is several times longer with it), and a function inlined everywhere
has no address of its own to name; the source is always there.  Without
ctags the extents are read by series.function_spans (`{` in column 0), and
the coverage says so.

A function's own kernel symbol (System.map, with the compiler's suffixes:
`.constprop.0`, `.isra.0`, `.part.0`, `.cold`) is where its instructions are
counted.  A function with none was inlined: its code is counted in its
callers', so the functions of its file that call it by name are followed up
to those that have a symbol (their hosts); a header's inline function has
callers everywhere and is not followed.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mmlab.attribution.functions import function_of, text_symbols
from mmlab.errors import MmlabError
from mmlab.kernels import kbuild, series
from mmlab.kernels.series import Hunk, Patch
from mmlab.machine import proc

CTAGS = "universal-ctags"
BRACES = "the column-0 braces of the source"
# The kernel's annotations between a function's type and its name or after
# its parameters (scripts/tags.sh ignores the same), which ctags would take
# for the name or the start of another declaration.
IGNORED = ("__acquires,__releases,__must_hold,__cond_acquires,__init,__exit,__ref,__meminit,"
           "__always_inline,__maybe_unused,__noinline,__cold,__weak,__latent_entropy,"
           "__no_sanitize_address,noinline,notrace,__visible,__printf,__scanf,__malloc")
SYSCALLS = [f"{prefix}SYSCALL_DEFINE{n}(n,...)={prefix.lower()}__do_sys_##n(__VA_ARGS__)"
            for prefix in ("", "COMPAT_") for n in range(7)]
C_FILE = re.compile(r"\.[ch]$")
# A line that holds only a comment, or nothing (a dereference `*p = 0;` is code).
COMMENT = re.compile(r"\s*(|/\*.*|\*|\*[ /].*|//.*)")
HOSTS_DEPTH = 8         # same-file callers followed at most this deep


@dataclass(frozen=True)
class Extent:
    name: str
    first: int          # 1-based: the signature's first line
    last: int           # the closing brace's line


@dataclass(frozen=True)
class Changed:
    """A function the series changes: its file, the patches that change it,
    whether code changed in it (not only comments or blank lines), and
    whether the series adds it (so the base never ran it)."""
    path: str
    function: str
    patches: tuple[int, ...]
    code: bool
    new: bool = False


@dataclass
class Changes:
    """The series' changed functions and where the base counts each: its
    own symbols, or its hosts' where it was inlined (`why` says when none)."""
    functions: list[Changed]
    parser: str                                             # CTAGS or BRACES
    symbols: dict[str, list[str]] = field(default_factory=dict)   # function -> symbols
    hosts: dict[str, list[str]] = field(default_factory=dict)     # inlined -> hosts' names
    why: dict[str, str] = field(default_factory=dict)             # function -> why uncounted


def read(patches: list[Patch], tree: Path | None, symbols: Path | None) -> Changes:
    """The functions `patches` change in the base `tree` (git's hunk
    headers name them where there is no tree, or it lacks a file the series
    changes, or it is not the base the series applies to), and the base
    kernel's `symbols` (a gzipped System.map: where its functions are
    counted)."""
    if tree is None or any(not (tree / h.path).is_file() and h.inserted_after != (-1,)
                           for p in patches for h in p.hunks):
        return _headers(patches, tree, symbols)
    try:
        return _placed(_from_source(patches, tree), tree, symbols)
    except MmlabError:      # the tree is not the base the series applies to
        return _headers(patches, tree, symbols)


def _headers(patches: list[Patch], tree: Path | None, symbols: Path | None) -> Changes:
    named = {(path, name): Changed(path, name, (p.number,), True)
             for p in patches for path, name in p.functions(None)}
    return _placed(Changes(list(named.values()), "git's hunk headers"), tree, symbols)


def _from_source(patches: list[Patch], tree: Path) -> Changes:
    """The changed functions, each patch read in the files as the patches
    before it left them (a scratch copy of the files the series touches)."""
    parser = CTAGS if shutil.which("ctags") else BRACES
    with tempfile.TemporaryDirectory(prefix="mmlab-changes-") as tmp:
        scratch = Path(tmp)
        for rel in dict.fromkeys(h.path for p in patches for h in p.hunks):
            if (tree / rel).is_file():
                (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(tree / rel, scratch / rel)
        base = {rel: {e.name for e in ex} for rel, ex in extents(scratch, _c_files(patches),
                                                                  parser).items()}
        found: dict[tuple[str, str], Changed] = {}
        for i, p in enumerate(patches):
            for c in _patch_functions(p, scratch, parser, scratch / f"{i}.diff"):
                was = found.get((c.path, c.function))
                found[(c.path, c.function)] = Changed(
                    c.path, c.function, (*(was.patches if was else ()), p.number),
                    c.code or bool(was and was.code), c.function not in base.get(c.path, set()))
    return Changes(list(found.values()), parser)


def _c_files(patches: list[Patch]) -> list[str]:
    return list(dict.fromkeys(f for p in patches for f in p.files if C_FILE.search(f)))


def _patch_functions(p: Patch, scratch: Path, parser: str, diff: Path) -> list[Changed]:
    """The functions one patch changes in `scratch` (the series up to the
    patch before), which it then applies there."""
    files = [f for f in p.files if C_FILE.search(f)]
    before = extents(scratch, files, parser)
    texts = {rel: (scratch / rel).read_text(errors="replace").splitlines() for rel in before}
    out: dict[str, Changed] = {}
    for h in p.hunks:
        code = not all(COMMENT.fullmatch(t) for t in [*_removed_text(h, texts.get(h.path, [])),
                                                       *h.added_text])
        for e in before.get(h.path, []):
            if any(e.first <= n <= e.last for n in h.removed) or any(
                    e.first <= n < e.last for n in h.inserted_after):
                was = out.get(f"{h.path}\0{e.name}")
                out[f"{h.path}\0{e.name}"] = Changed(h.path, e.name, (p.number,),
                                                     code or bool(was and was.code))
    diff.write_text(p.diff)
    kbuild.apply_patch(scratch, diff)
    after = extents(scratch, files, parser)
    for rel, ex in after.items():
        had = {e.name for e in before.get(rel, [])}
        out.update({f"{rel}\0{e.name}": Changed(rel, e.name, (p.number,), True)
                    for e in ex if e.name not in had})
    return list(out.values())


def _removed_text(h: Hunk, lines: list[str]) -> list[str]:
    return [lines[n - 1] for n in h.removed if 0 < n <= len(lines)]


def extents(root: Path, files: list[str], parser: str = CTAGS) -> dict[str, list[Extent]]:
    """Each existing C file's function extents (relative paths under `root`)."""
    there = [rel for rel in files if (root / rel).is_file()]
    if parser == BRACES or not there:
        return {rel: [Extent(name, first, last) for first, _, last, name in
                      series.function_spans((root / rel).read_text(errors="replace"))]
                for rel in there}
    found: dict[str, list[Extent]] = {rel: [] for rel in there}
    out = proc.call(["ctags", "--language-force=C", "--kinds-C=f", "--fields=+ne", "-x",
                     "--_xformat=%n %{end} %N %F", "-I", IGNORED,
                     *(a for d in SYSCALLS for a in ("-D", d)), "-o", "-", *there],
                    cwd=root, what="ctags").stdout
    for line in out.splitlines():
        f = line.split(" ", 3)
        if len(f) == 4 and f[3] in found and f[0].isdigit() and f[1].isdigit():
            found[f[3]].append(Extent(f[2], int(f[0]), int(f[1])))
    for rel, ex in found.items():
        lines = (root / rel).read_text(errors="replace").splitlines()
        found[rel] = sorted((Extent(e.name, signature_start(lines, e.first), e.last)
                             for e in ex), key=lambda e: e.first)
    return found


def signature_start(lines: list[str], at: int) -> int:
    """The first line of the signature whose name is on line `at` (1-based):
    the lines above it back to a blank one, a directive or the end of a
    statement, block or comment (`static int` on a line of its own)."""
    while at > 1 and lines[at - 2].strip() and not re.search(r"[;{}]\s*$|\*/\s*$|^\s*#|^\s*/?\*",
                                                             lines[at - 2]):
        at -= 1
    return at


def _placed(changes: Changes, tree: Path | None, symbols: Path | None) -> Changes:
    """Each changed function's symbols in the base kernel, or its hosts,
    or why it has none."""
    table = symbol_names(symbols)
    for c in changes.functions:
        if not c.code or c.new:
            changes.why[c.function] = "added by the series" if c.new else "comments only"
        elif c.function in table:
            changes.symbols[c.function] = table[c.function]
        elif tree is None:
            changes.why[c.function] = "no symbol in the base kernel (no source to follow)"
        elif (tree / "vmlinux").is_file() and c.path.endswith(".c") and \
                not (tree / c.path).with_suffix(".o").is_file():
            changes.why[c.function] = f"not built in this kernel ({c.path} is not compiled)"
        elif c.path.endswith(".h"):
            changes.why[c.function] = "inline in a header: its callers are not followed"
        else:
            hosts = inlined_into(tree, c.path, c.function, table)
            changes.hosts[c.function] = hosts
            changes.symbols[c.function] = [s for h in hosts for s in table[h]]
            if not hosts:
                changes.why[c.function] = "no symbol, and no caller in its file has one"
    return changes


def symbol_names(symbols: Path | None) -> dict[str, list[str]]:
    """A System.map's text symbols by the function they compile: `foo`
    -> [foo, foo.constprop.0, ...] (none without one)."""
    out: dict[str, list[str]] = {}
    if symbols is None or not symbols.is_file():
        return out
    for _, name in text_symbols(symbols):
        out.setdefault(function_of(name), []).append(name)
    return out


def inlined_into(tree: Path, rel: str, name: str, table: dict[str, list[str]]) -> list[str]:
    """The functions of `rel` that have a symbol and call `name`, directly
    or through callers inlined as it was (at most HOSTS_DEPTH deep)."""
    lines = (tree / rel).read_text(errors="replace").splitlines()
    ex = extents(tree, [rel], CTAGS if shutil.which("ctags") else BRACES).get(rel, [])
    bodies = {e.name: "\n".join(lines[e.first - 1:e.last]) for e in ex}
    hosts: dict[str, None] = {}
    seen, frontier = {name}, [name]
    for _ in range(HOSTS_DEPTH):
        callers = [f for g in frontier for f, body in bodies.items()
                   if f not in seen and re.search(rf"\b{re.escape(g)}\s*\(", body)]
        seen.update(callers)
        hosts.update((f, None) for f in callers if f in table)
        frontier = [f for f in callers if f not in table]
        if not frontier:
            break
    return list(hosts)
