"""A patch series read as a list posts it, and what each patch changes.

Input is files from `git format-patch` (a cover letter, `0000-cover-letter.patch`
or a `[PATCH 0/n]` subject, is skipped), one mbox saved from a list archive
(several messages: the cover letter, replies and messages with no PATCH tag
are skipped), or a single mail-form or bare diff.  Bodies are decoded by the
standard library's `email` package (quoted-printable, base64, charsets,
attachments of a text type).  The patches come back ordered by their n/m
numbers; a series with a number missing or given twice, mixed versions, a
patch message without a diff, or a file that holds neither mail nor a diff
is refused in one line naming the file.

A patch's changed functions are found by reading the base tree's files: the
C function whose span (signature to the closing brace in column 0, the
kernel's style) holds a removed line or an insertion point.  Limits: a
function whose body does not open with `{` in column 0 (a one-line inline
written in another style, a macro-generated body) is not seen; a change
between functions (a global, a struct, a comment) names none; a function the
patch adds is named from the added lines when its whole signature and
opening brace are in them.  Without the file (no tree, or a new file) the
function git names in the hunk header is used.
"""

from __future__ import annotations

import email
import email.policy
import mailbox
import re
from dataclasses import dataclass, field
from email.message import EmailMessage, Message
from pathlib import Path

from mmlab.errors import MmlabError

TAG = re.compile(r"^\s*\[(?P<tag>[^\]]*\bPATCH\b[^\]]*)\]\s*(?P<subject>.*)$", re.I | re.S)
REPLY = re.compile(r"^\s*(re|aw|sv|fwd?)\s*:", re.I)
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$")
PATH_LINE = re.compile(r"^(?:--- |\+\+\+ |rename from |rename to )(\S+)")
# Words before a parenthesis that are not the name of the function defined.
NOT_NAMES = frozenset({"__attribute__", "__printf", "__scanf", "__aligned", "__section",
                       "__must_hold", "__acquires", "__releases", "__cond_acquires", "if",
                       "while", "for", "switch", "return", "sizeof", "typeof", "__typeof__"})
SYSCALL = re.compile(r"^(?:COMPAT_)?SYSCALL_DEFINE\d$")


@dataclass(frozen=True)
class Hunk:
    """One hunk: its file, the old file's line numbers of removed lines and
    of the line before each insertion, and the function git named."""
    path: str
    removed: tuple[int, ...]
    inserted_after: tuple[int, ...]
    git_function: str
    added_text: tuple[str, ...]


@dataclass(frozen=True)
class Patch:
    number: int
    total: int
    version: int
    subject: str
    author: str
    diff: str
    origin: str
    hunks: tuple[Hunk, ...] = field(default=())

    @property
    def files(self) -> list[str]:
        """The files the patch changes, in the order it changes them."""
        return list(dict.fromkeys(h.path for h in self.hunks))

    def functions(self, tree: Path | None = None) -> list[tuple[str, str]]:
        """(file, function) for each function the patch changes, in order."""
        found: dict[tuple[str, str], None] = {}
        for h in self.hunks:
            for name in hunk_functions(h, tree):
                found[(h.path, name)] = None
        return list(found)


def read(files: list[Path]) -> list[Patch]:
    """The series in `files` (format-patch files or one mbox), ordered and checked."""
    patches: list[Patch] = []
    for f in files:
        if not f.is_file():
            raise MmlabError(f"{f}: no such patch or mbox file")
        if re.match(r"(v\d+-)?0000-cover-letter", f.name):
            continue
        patches += _read_file(f)
    if not patches:
        raise MmlabError(f"{', '.join(map(str, files))}: no patches (only a cover letter, "
                         "replies or messages without a diff)")
    return _ordered(patches)


def _read_file(f: Path) -> list[Patch]:
    data = f.read_bytes()
    if data.startswith(b"From "):
        box = mailbox.mbox(f, factory=None, create=False)
        messages = [email.message_from_bytes(box.get_bytes(k), policy=email.policy.default)
                    for k in box.iterkeys()]
    elif re.match(rb"[A-Za-z-]+: ", data):
        messages = [email.message_from_bytes(data, policy=email.policy.default)]
    elif re.search(rb"^(diff --git |--- )", data, re.M) and re.search(rb"^@@ ", data, re.M):
        text = data.decode(errors="replace")
        return [_patch(f.name, 1, 1, 1, f.stem, "", text)]
    else:
        raise MmlabError(f"{f}: neither a patch (format-patch or diff) nor an mbox")
    out = []
    for i, msg in enumerate(messages, 1):
        where = f"{f}" if len(messages) == 1 else f"{f} message {i}"
        p = _from_message(msg, where, alone=len(messages) == 1)
        if p:
            out.append(p)
    return out


def _from_message(msg: Message, where: str, alone: bool) -> Patch | None:
    """A patch from one mail, or None for a cover letter, a reply or a
    message that is not a patch; a PATCH message without a diff is an error."""
    subject = " ".join(str(msg.get("Subject", "")).split())
    if REPLY.match(subject):
        return None
    m = TAG.match(subject)
    if not m and not alone:
        return None
    tag, title = (m.group("tag"), m.group("subject")) if m else ("", subject)
    nm = re.search(r"\b(\d+)/(\d+)\b", tag)
    number, total = (int(nm.group(1)), int(nm.group(2))) if nm else (1, 1)
    if number == 0:
        return None
    ver = re.search(r"\bv(\d+)\b", tag, re.I)
    body = _body(msg)
    author = str(msg.get("From", ""))
    inbody = re.match(r"From: (.+)\n", body)
    if inbody:
        author = inbody.group(1).strip()
    if not re.search(r"^@@ ", body, re.M):
        raise MmlabError(f"{where}: [{tag or 'PATCH'}] {title!r} has no diff")
    return _patch(where, number, total, int(ver.group(1)) if ver else 1, title, author, body)


def _body(msg: Message) -> str:
    """The first text part holding a diff (inline or attached), decoded;
    else the first text part."""
    texts = []
    for part in msg.walk():
        if part.get_content_maintype() == "text" and isinstance(part, EmailMessage):
            texts.append(str(part.get_content()))
    with_diff = [t for t in texts if re.search(r"^@@ ", t, re.M)]
    return (with_diff or texts or [""])[0]


def _patch(where: str, number: int, total: int, version: int, subject: str, author: str,
           text: str) -> Patch:
    diff = _diff_of(text)
    return Patch(number, total, version, subject, author, diff, where, tuple(parse_hunks(diff)))


def _diff_of(text: str) -> str:
    """From the first file header to the end, without format-patch's
    signature (`-- ` and the git version)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith("diff --git ")
                  or (line.startswith("--- ") and i + 1 < len(lines)
                      and lines[i + 1].startswith("+++ "))), 0)
    end = len(lines)
    for i in range(len(lines) - 1, start, -1):
        if lines[i] == "-- " and len(lines) - i <= 4:
            end = i
            break
    return "\n".join(lines[start:end]) + "\n"


def _ordered(patches: list[Patch]) -> list[Patch]:
    """By number, refusing a series with mixed versions or totals, or a
    number missing or given twice."""
    for what, of in (("versions", lambda p: f"v{p.version}"), ("totals", lambda p: p.total)):
        seen = {of(p): p for p in patches}
        if len(seen) > 1:
            a, b = list(seen.values())[:2]
            raise MmlabError(f"mixed {what} in one series: {a.origin} is "
                             f"[{a.number}/{a.total} v{a.version}], {b.origin} is "
                             f"[{b.number}/{b.total} v{b.version}]; give one version's patches")
    by_number: dict[int, Patch] = {}
    for p in patches:
        if p.number in by_number:
            raise MmlabError(f"patch {p.number}/{p.total} given twice: "
                             f"{by_number[p.number].origin} and {p.origin}")
        by_number[p.number] = p
    total = patches[0].total
    missing = [n for n in range(1, total + 1) if n not in by_number]
    if missing or max(by_number) > total:
        raise MmlabError(f"series of {total}: patch {missing[0] if missing else max(by_number)}"
                         f"/{total} {'is missing' if missing else 'is out of range'}")
    return [by_number[n] for n in sorted(by_number)]


def paths_in(text: str) -> list[str]:
    """Every file a diff names (old and new sides, renames), without the
    first path component that `patch -p1` strips."""
    found: dict[str, None] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = PATH_LINE.match(line)
        header = line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1][:4] == "+++ "
        header |= line.startswith("+++ ") and i > 0 and lines[i - 1][:4] == "--- "
        if m and m.group(1) != "/dev/null" and (header or line.startswith("rename")):
            path = m.group(1)
            found[path if line.startswith("rename") else path.split("/", 1)[-1]] = None
    return list(found)


def parse_hunks(diff: str) -> list[Hunk]:
    """The hunks of a unified diff, with old-file line numbers of what changed."""
    hunks: list[Hunk] = []
    path, lines = "", diff.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("+++ "):
            new = line[4:].split("\t")[0].strip()
            path = new.split("/", 1)[-1] if new != "/dev/null" else path
        elif line.startswith("--- ") and not line.startswith("--- /dev/null"):
            path = line[4:].split("\t")[0].strip().split("/", 1)[-1]
        m = HUNK.match(line)
        if m:
            old, old_n = int(m.group(1)), int(m.group(2) or 1)
            new_n = int(m.group(4) or 1)
            i, hunk = _hunk(lines, i + 1, path, old, old_n, new_n, m.group(5).strip())
            hunks.append(hunk)
            continue
        i += 1
    return hunks


def _hunk(lines: list[str], i: int, path: str, old: int, old_n: int, new_n: int,
          header: str) -> tuple[int, Hunk]:
    removed, inserted, added = [], [], []
    at = old
    while i < len(lines) and (old_n > 0 or new_n > 0):
        line = lines[i]
        kind = line[:1]
        if kind == "-":
            removed.append(at)
            at, old_n = at + 1, old_n - 1
        elif kind == "+":
            inserted.append(at - 1)
            added.append(line[1:])
            new_n -= 1
        elif kind in (" ", ""):
            at, old_n, new_n = at + 1, old_n - 1, new_n - 1
        elif kind != "\\":
            break
        i += 1
    return i, Hunk(path, tuple(removed), tuple(dict.fromkeys(inserted)), header, tuple(added))


def function_spans(text: str) -> list[tuple[int, int, int, str]]:
    """(first line, opening brace line, closing brace line, name) of each C
    function in `text`, 1-based: a `{` alone in column 0 opens a body, the
    next `}` in column 0 closes it, and the signature is the lines above
    back to a blank line or the end of a statement, comment or directive."""
    lines = text.splitlines()
    spans = []
    for at, line in enumerate(lines):
        if line.rstrip() != "{":
            continue
        first = at
        while first > 0 and not lines[first - 1].strip():        # a blank line before `{`
            first -= 1
        while first > 0 and lines[first - 1].strip() and not re.search(
                r"[;}]\s*$|\*/\s*$|^#", lines[first - 1]):
            first -= 1
        name = signature_name(" ".join(lines[first:at]))
        close = next((j for j in range(at + 1, len(lines)) if lines[j].startswith("}")), None)
        if name and close is not None:
            spans.append((first + 1, at + 1, close + 1, name))
    return spans


def signature_name(signature: str) -> str:
    """The function a C signature defines: the first word before a
    parenthesis at depth 0 that is not an attribute or keyword.  A syscall's
    SYSCALL_DEFINEn(name, ...) is named as its body's symbol, __do_sys_name."""
    depth = 0
    for m in re.finditer(r"(\w+)\s*\(|[()]", signature):
        if m.group(1) and depth == 0 and m.group(1) not in NOT_NAMES:
            if SYSCALL.match(m.group(1)):
                arg = re.match(r"\s*(\w+)", signature[m.end():])
                return f"__do_sys_{arg.group(1)}" if arg else ""
            return m.group(1)
        depth += 1 if m.group(0).endswith("(") else -1
    return ""


def hunk_functions(h: Hunk, tree: Path | None) -> list[str]:
    """The functions a hunk changes: read from the base tree's file when
    there is one, else the name in git's hunk header."""
    source = tree / h.path if tree else None
    names: dict[str, None] = {}
    if source and source.is_file():
        for first, brace, close, name in function_spans(source.read_text(errors="replace")):
            if any(first <= n <= close for n in h.removed) or any(
                    brace <= n < close for n in h.inserted_after):
                names[name] = None
    elif h.git_function:
        name = signature_name(h.git_function)
        if name:
            names[name] = None
    for _, _, _, name in function_spans("\n".join(h.added_text)):
        names[name] = None
    return list(names)
