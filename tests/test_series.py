"""Reading a patch series: format-patch files, an mbox as a list archive
saves it, and the functions each patch changes.  Pure Python, no kernel."""

from __future__ import annotations

import email.policy
import subprocess
from email.message import EmailMessage
from pathlib import Path

import pytest

from mmlab.errors import MmlabError
from mmlab.kernels import series

PATCHES = Path(__file__).resolve().parents[1] / "experiments" / "patches"

KSM_C = """\
#include <linux/ksm.h>

static int ksm_flag;

/* Walk the stable node's rmap items. */
static void rmap_walk_ksm(struct folio *folio,
\t\t\t  struct rmap_walk_control *rwc)
{
\tint a = 1;
\tint b = 2;
\treturn;
}

int __weak __attribute__((unused)) ksm_madvise(int x)
{
\treturn x;
}

SYSCALL_DEFINE3(madvise, unsigned long, start, size_t, len_in, int, behavior)
{
\treturn 0;
}
"""


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git tree with mm/ksm.c and three commits on it: a series to format."""
    r = tmp_path / "linux"
    (r / "mm").mkdir(parents=True)
    (r / "mm" / "ksm.c").write_text(KSM_C)
    git(r, "init", "-q")
    git(r, "add", ".")
    git(r, "commit", "-qm", "base")
    edits = [("int a = 1;", "int a = 3;", "mm/ksm: set a to three"),
             ("\treturn x;", "\treturn x + 1;", "mm/ksm: one more"),
             ("\treturn 0;", "\treturn -EINVAL;", "mm/madvise: refuse")]
    for old, new, subject in edits:
        path = r / "mm" / "ksm.c"
        path.write_text(path.read_text().replace(old, new))
        git(r, "commit", "-qam", subject)
    return r


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=A U Thor",
                           "-c", "user.email=author@example.org", *args],
                          check=True, capture_output=True, text=True).stdout


def test_format_patch_files_are_read_in_series_order_without_the_cover_letter(repo, tmp_path):
    out = tmp_path / "out"
    git(repo, "format-patch", "-q", "--cover-letter", "-v3", "-3", "-o", str(out))
    files = sorted(out.glob("*.patch"), reverse=True)            # given in any order
    assert files[-1].name == "v3-0000-cover-letter.patch"
    got = series.read(files)
    assert [(p.number, p.total, p.version) for p in got] == [(1, 3, 3), (2, 3, 3), (3, 3, 3)]
    assert [p.subject for p in got] == ["mm/ksm: set a to three", "mm/ksm: one more",
                                        "mm/madvise: refuse"]
    assert got[0].author == "A U Thor <author@example.org>"
    assert got[0].files == ["mm/ksm.c"] and got[0].diff.startswith("diff --git a/mm/ksm.c")
    assert "-- \n" not in got[0].diff and not got[0].diff.rstrip().endswith(".0")  # no signature
    base = tmp_path / "base"
    git(repo, "worktree", "add", "-q", str(base), "HEAD~3")
    assert [p.functions(base) for p in got] == [[("mm/ksm.c", "rmap_walk_ksm")],
                                                [("mm/ksm.c", "ksm_madvise")],
                                                [("mm/ksm.c", "__do_sys_madvise")]]


def mail(subject: str, body: str, cte: str | None = None, **headers: str) -> bytes:
    m = EmailMessage(policy=email.policy.SMTP)
    m["From"] = headers.get("sender", "A U Thor <author@example.org>")
    m["Subject"] = subject
    m.set_content(body, cte=cte) if cte else m.set_content(body)
    return b"From mboxrd@z Thu Jan  1 00:00:00 1970\n" + m.as_bytes().replace(b"\r\n", b"\n")


def test_an_mbox_from_a_list_archive_skips_cover_letter_replies_and_chatter(repo, tmp_path):
    one, two, three = (git(repo, "format-patch", "--stdout", "-1", f"HEAD~{n}").split("\n\n", 1)[1]
                       for n in (2, 1, 0))
    box = tmp_path / "series.mbox"
    box.write_bytes(b"\n".join([
        mail("[PATCH v2 0/3] mm: three things", "The cover letter.\n"),
        mail("[PATCH v2 3/3] mm/madvise: refuse", three, cte="base64"),
        mail("Re: [PATCH v2 1/3] mm/ksm: set a to three", "> " + one.replace("\n", "\n> ")),
        mail("[PATCH v2 1/3] mm/ksm: set a to three", one, cte="quoted-printable"),
        mail("Meeting notes", "nothing to see\n"),
        mail("[PATCH v2 2/3] mm/ksm: one more", two, sender="Someone <s@example.org>"
             ).replace(b"mm/ksm: one more", b"mm/ksm: one\n more", 1),       # a folded subject
    ]))
    got = series.read([box])
    assert [p.number for p in got] == [1, 2, 3] and {p.version for p in got} == {2}
    assert got[1].subject == "mm/ksm: one more"                         # folded, unfolded
    assert got[1].author == "Someone <s@example.org>"
    assert got[2].diff.count("\n+\treturn -EINVAL;") == 1                 # base64 decoded
    assert "int a = 3;" in got[0].diff and "=3D" not in got[0].diff       # quoted-printable
    assert got[2].origin.endswith("series.mbox message 2")


def test_a_mail_form_patch_without_git_headers_is_read_and_its_function_found(tmp_path):
    (p,) = series.read([PATCHES / "seed004-ksm-rmap-walk-range-6.12.patch"])
    assert (p.number, p.total, p.version) == (1, 1, 1)
    assert p.subject.startswith("ksm: narrow the anon_vma interval tree walk")
    assert p.files == ["mm/ksm.c"] and p.hunks[0].git_function == ""
    assert series.paths_in(p.diff) == ["mm/ksm.c"]


def test_changed_functions_come_from_the_base_file_not_the_hunk_header(tmp_path):
    base = tmp_path / "base"
    (base / "mm").mkdir(parents=True)
    (base / "mm" / "ksm.c").write_text(KSM_C)
    diff = ("--- a/mm/ksm.c\n+++ b/mm/ksm.c\n"
            "@@ -3,3 +3,3 @@ static int wrong_name(void)\n"
            " \n-static int ksm_flag;\n+static long ksm_flag;\n \n"           # between functions
            "@@ -8,2 +8,3 @@\n {\n+\tint z = 0;\n \tint a = 1;\n"            # at the top
            "@@ -17,2 +18,7 @@\n \n+static void ksm_new(void)\n+{\n+\treturn;\n+}\n+\n"
            " SYSCALL_DEFINE3(madvise, unsigned long, start, size_t, len_in, int, behavior)\n")
    (hunk_global, hunk_top, hunk_added) = series.parse_hunks(diff)
    assert hunk_global.removed == (4,) and hunk_top.inserted_after == (8,)
    assert series.hunk_functions(hunk_global, base) == []
    assert series.hunk_functions(hunk_top, base) == ["rmap_walk_ksm"]
    assert series.hunk_functions(hunk_added, base) == ["ksm_new"]        # added, not the syscall
    assert series.hunk_functions(hunk_global, None) == ["wrong_name"]    # no tree: git's name
    spans = series.function_spans(KSM_C)
    assert [(s[0], s[3]) for s in spans] == [(6, "rmap_walk_ksm"), (14, "ksm_madvise"),
                                             (19, "__do_sys_madvise")]
    assert series.function_spans("static int f(int a,\n\t\tint b)\n\n{\n}\n") == [(1, 4, 5, "f")]


def test_a_bad_series_is_refused_naming_what_is_wrong(repo, tmp_path):
    out = tmp_path / "out"
    git(repo, "format-patch", "-q", "-3", "-o", str(out))
    files = sorted(out.glob("*.patch"))
    with pytest.raises(MmlabError, match=r"series of 3: patch 2/3 is missing"):
        series.read([files[0], files[2]])
    with pytest.raises(MmlabError, match=r"patch 1/3 given twice: .*0001-.* and .*0001-"):
        series.read([files[0], files[0], files[1], files[2]])
    v2 = tmp_path / "v2.patch"
    v2.write_text(files[1].read_text().replace("[PATCH 2/3]", "[PATCH v2 2/3]"))
    with pytest.raises(MmlabError, match=r"mixed versions in one series"):
        series.read([files[0], v2, files[2]])
    nodiff = tmp_path / "nodiff.mbox"
    nodiff.write_bytes(mail("[PATCH 1/1] mm: words only", "No diff here.\n"))
    with pytest.raises(MmlabError, match=r"nodiff.mbox: \[PATCH 1/1\] 'mm: words only' has no "
                                         r"diff"):
        series.read([nodiff])
    cover = tmp_path / "cover.mbox"
    cover.write_bytes(mail("[PATCH 0/2] mm: a plan", "Later.\n") + b"\n"
                      + mail("Re: [PATCH 0/2] mm: a plan", "Sounds good.\n"))
    with pytest.raises(MmlabError, match=r"cover.mbox: no patches"):
        series.read([cover])
    neither = tmp_path / "notes.txt"
    neither.write_text("just some notes\n")
    with pytest.raises(MmlabError, match=r"notes.txt: neither a patch .* nor an mbox"):
        series.read([neither])
    with pytest.raises(MmlabError, match=r"missing.patch: no such patch or mbox file"):
        series.read([tmp_path / "missing.patch"])


def test_a_bare_diff_is_one_patch_named_by_its_file(tmp_path):
    bare = tmp_path / "fix-ksm.diff"
    bare.write_text("--- a/mm/ksm.c\n+++ b/mm/ksm.c\n"
                    "@@ -9,1 +9,1 @@\n-\tint a = 1;\n+\tint a = 2;\n")
    (p,) = series.read([bare])
    assert (p.subject, p.number, p.files) == ("fix-ksm", 1, ["mm/ksm.c"])
