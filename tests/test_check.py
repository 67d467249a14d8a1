"""The patch check: a series measured against its base on counts, with the
fake target standing for the guests (each kernel of the series a fake
kernel whose counts step where the model says), the report's text in the
kernel test robot's form, the exit statuses, bad input refused before
anything is made; and one real check of seed 003's patch in a guest."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mmlab.attribution.functions import FunctionInsns
from mmlab.check import request as requests
from mmlab.check import session
from mmlab.errors import MmlabError
from mmlab.kernels.images import Kernel
from mmlab.report import json as report_json
from mmlab.report import robot
from mmlab.run import driver
from mmlab.store import Store
from mmlab.targets import TargetPool

from .conftest import mmlab
from .fake_target import FakeTarget

ROOT = Path(__file__).resolve().parents[1]
PROFILE = """
name = "pageout"
workload = "pageout-refault"
repetitions = 6
metrics = ["advise_kernel_insns_per_page"]
baseline = { kernel = "local:base" }
[params]
mapping-kb = 1024
[matrix]
kernel = ["local:base"]
"""
DIFF = """\
--- a/mm/vmscan.c
+++ b/mm/vmscan.c
@@ -10,3 +10,3 @@ static int shrink(void)
 {{
-\treturn {old};
+\treturn {new};
 }}
"""


def patch_file(where: Path, n: int, total: int, subject: str) -> Path:
    path = where / f"{n:04d}-p{n}.patch"
    path.write_text(f"From: A Developer <dev@example.org>\nSubject: [PATCH {n}/{total}] "
                    f"{subject}\n\nWhy.\n---\n" + DIFF.format(old=n, new=n + 1))
    return path


def kernel(name: str) -> Kernel:
    return Kernel(name=name, version="6.12.118", source="debian-source:6.12 6.12.118-1",
                  config_sha256="c0ffee" * 10, dir="/nonexistent",
                  details={"source": "debian-source:6.12 6.12.118-1",
                           "compiler": "gcc (Debian 14.2.0-19) 14.2.0"})


class Counting(FakeTarget):
    """Kernels in `step_at` count `step` times the instructions in the
    advise window, and shrink_folio_list is where they go."""

    def __init__(self, step_at: set[str], step: float = 1.3):
        super().__init__(cv=0.001, model=lambda arm: (step if arm.kernel in step_at else 1.0,
                                                      {}))
        self.step_at, self.step = step_at, step
        self.attributed: list[str] = []

    def attribute(self, arm, plan):
        self.attributed.append(arm.kernel)
        more = self.step if arm.kernel in self.step_at else 1.0
        advise = {"shrink_folio_list": 400.0 * more, "page_vma_mapped_walk": 230.5}
        return {"functions": FunctionInsns(
            windows={"advise": advise}, kernel={"advise": sum(advise.values()) + 3},
            unresolved={"advise": 3.0}, units={"advise": "page"}, kernel_release="fake",
            text_address=0).model_dump()}


def checked(tmp_path: Path, patches: int, step_at: set[str]):
    """A check of a series of `patches` on the fake target."""
    (tmp_path / "p.toml").write_text(PROFILE)
    files = [patch_file(tmp_path, n, patches, f"mm: patch number {n}")
             for n in range(1, patches + 1)]
    asked = requests.read(files, str(ROOT / "tests"), None, [tmp_path / "p.toml"])
    fake = Counting(step_at)
    kernels = [kernel("local:base")] + [kernel(f"local:p{n}") for n in range(1, patches + 1)]
    pool = TargetPool(make=lambda arm: fake, say=lambda m: None)
    result = session.run(Store(tmp_path / "r"), asked, kernels, driver.Here(pool),
                         str(tmp_path / "r"))
    return result, fake


@pytest.fixture(autouse=True)
def a_tree(monkeypatch):
    """The base `tests/` passes for a kernel tree (a Makefile and a Kconfig)."""
    monkeypatch.setattr(requests, "check_base", lambda spec: None)


def test_a_series_change_is_confirmed_explained_and_placed_on_its_patch(tmp_path):
    result, fake = checked(tmp_path, 3, {"local:p2", "local:p3"})
    assert result.changed and len(result.found) == 1
    f = result.found[0]
    assert f.patch == 2 and f.change.outcome == "regression"
    assert f.change.metric == "advise_kernel_insns_per_page"
    assert sorted(fake.attributed) == ["local:base", "local:p3"]      # the confirmation's arms
    # the first look, its confirmation, and the bisection's steps: p3 is the confirmation,
    # p1 (unchanged) and p2 (changed) are measured once each
    assert len(result.experiments) == 4 and len(f.narrowing) == 4
    assert "  local:p1 (base + patch 1 of 3): unchanged (no change)" in f.narrowing
    assert f.narrowing[-1].startswith("advise_kernel_insns_per_page: regression introduced "
                                      "between local:p1 (base + patch 1 of 3) and local:p2 "
                                      "(base + patches 1-2 of 3)")
    text = robot.text(result)
    lines = text.splitlines()
    assert re.fullmatch(r"\[mm\] mm: patch number 2: pageout\.advise_kernel_insns_per_page "
                        r"\+30\.\d% regression", lines[0]), lines[0]
    assert "patch:    [PATCH 2/3] mm: patch number 2 (A Developer <dev@example.org>)" in lines
    head = next(i for i, line in enumerate(lines) if line.split() == ["base", "%stddev",
                                                                      "%change", "patched",
                                                                      "%stddev"])
    row = lines[head + 2].split()
    assert row[2].startswith("+30.") and row[5] == "advise_kernel_insns_per_page", row
    assert any(line.startswith("functions (advise, kernel instructions per page, exclusive): "
                               "shrink_folio_list +120") for line in lines)
    assert "compiler gcc (Debian 14.2.0-19) 14.2.0" in text and "config sha256 c0ffeec0ffee" \
        in text
    assert any(line.strip().startswith("mmlab check ") for line in lines)
    record = json.loads(report_json.check(result))
    assert record["changes"][0]["subject"] == lines[0] and record["changes"][0]["patch"] == 2


def test_nothing_changed_is_one_line(tmp_path):
    result, fake = checked(tmp_path, 1, set())
    assert not result.changed and not fake.attributed
    assert len(result.experiments) == 1                   # no confirmation asked for
    text = robot.text(result)
    assert text.count("\n") == 1
    assert text.startswith(f"mmlab check: no change: {result.paths} path(s) of 1 profile(s) "
                           "checked on counts")
    assert "a window's kernel instructions 1.00%" in text


def faked(monkeypatch, step_at: set[str], fail: bool = False) -> None:
    """`mmlab check` in this process builds nothing (a fake kernel per patch)
    and runs its trials on the fake."""
    import mmlab.targets
    from mmlab.kernels import kbuild
    from mmlab.targets import TrialError
    monkeypatch.setattr(kbuild, "build_series", lambda spec, patches, *a, **k: [
        kernel("local:base"), *(kernel(f"local:p{n}") for n in range(1, len(patches) + 1))])
    fake = Counting(step_at)
    if fail:
        def broken(arm, plan):
            raise TrialError(f"{arm.name}: no boot", {})
        fake.run_trial = broken
    monkeypatch.setattr(mmlab.targets, "TargetPool", lambda *a, **k: TargetPool(
        make=lambda arm: fake, say=lambda m: None))


def invoke(tmp_path: Path, *args: str):
    from typer.testing import CliRunner

    from mmlab.cli import app
    (tmp_path / "p.toml").write_text(PROFILE)
    return CliRunner().invoke(app, ["check", *args, "--profile", str(tmp_path / "p.toml"),
                                    "--results", str(tmp_path / "r")])


def cli(monkeypatch, tmp_path: Path, step_at: set[str], fail: bool = False, *args: str):
    """`mmlab check` of a two-patch series, faked."""
    faked(monkeypatch, step_at, fail)
    files = [patch_file(tmp_path, n, 2, f"mm: patch number {n}") for n in (1, 2)]
    return invoke(tmp_path, *map(str, files), "--base", str(ROOT / "tests"), *args)


@pytest.mark.parametrize("step_at, status", [(set(), 0), ({"local:p2"}, 1)])
def test_the_exit_status_says_whether_a_path_changed(monkeypatch, tmp_path, step_at, status):
    done = cli(monkeypatch, tmp_path, step_at, False, "--json")
    assert done.exit_code == status, done.output
    record = json.loads(done.stdout)
    assert record["changed"] is bool(status) and len(record["patches"]) == 2
    if status:
        assert [c["patch"] for c in record["changes"]] == [2]


def test_failed_trials_are_a_failure_and_no_verdict(monkeypatch, tmp_path):
    done = cli(monkeypatch, tmp_path, {"local:p2"}, True)
    assert done.exit_code == 2
    assert "trial(s) failed: the check is incomplete" in done.stderr
    assert done.stdout.startswith("mmlab check: incomplete, no verdict on the paths of trials "
                                  "that failed: pageout on local:base: ")
    assert "no change" not in done.stdout and "[mm]" not in done.stdout


COVER = """From mmlab Mon Sep 17 00:00:00 2001
From: A Developer <dev@example.org>
Subject: [PATCH 0/2] mm: a cover letter

Two patches follow, some day.
"""


@pytest.mark.parametrize("what, args, wanted", [
    ("a missing patch", ["T/nowhere.patch"], r"nowhere.patch: no such patch or mbox file"),
    ("an mbox with no patches", ["T/cover.mbox"], r"cover.mbox: no patches"),
    ("a base that is no tree", ["T/one.patch", "--base", "T/notatree"],
     r"--base \S*notatree: neither debian-source:SERIES nor a kernel source tree"),
    ("a base the catalog lacks", ["T/one.patch", "--base", "debian-source:9.99"],
     r"--base debian-source:9.99: the Debian catalog has no linux-source-9.99"),
    ("a suite that does not parse", ["T/one.patch", "--base", "T/tree", "--suite",
                                     "T/bad.toml"], r"bad.toml"),
    ("a profile with nothing to count", ["T/one.patch", "--base", "T/tree", "--profile",
                                         "T/churn.toml"], r"churn.toml: profile c: "
                                                          r"mremap-churn has no window"),
    ("an output folder that is a file", ["T/one.patch", "-o", "T/bad.toml"],
     r"-o \S*bad.toml: exists and is not a directory"),
    ("a patch that does not apply", ["T/one.patch", "--base", "T/tree", "--profile", "P"],
     r"patch \S*one.patch does not apply: mm/vmscan.c: Hunk #1 FAILED"),
])
def test_bad_input_is_one_line_before_anything_is_made(tmp_path, what, args, wanted):
    (tmp_path / "cover.mbox").write_text(COVER)
    patch_file(tmp_path, 1, 1, "mm: one").rename(tmp_path / "one.patch")
    tree = tmp_path / "tree"
    (tree / "mm").mkdir(parents=True)
    (tree / "Makefile").write_text("all:\n")
    (tree / "Kconfig").write_text("")
    (tree / "mm/vmscan.c").write_text("\n" * 9 + "static int shrink(void)\n{\n\treturn 7;\n}\n")
    (tmp_path / "bad.toml").write_text("name = \n")
    (tmp_path / "churn.toml").write_text(
        'name = "c"\nworkload = "mremap-churn"\nrepetitions = 6\nmetrics = ["ops_per_s_real"]\n'
        'baseline = { kernel = "debian:6.12" }\n[matrix]\nkernel = ["debian:6.12"]\n')
    args = [*args, *([] if "--base" in args else ["--base", "debian-source:6.12"]),
            *([] if "--profile" in args or "--suite" in args else ["--profile", "P"])]
    args = [a.replace("T/", f"{tmp_path}/") if a != "P" else
            str(ROOT / "experiments/suites/unmap-young-shmem.toml") for a in args]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    done = mmlab("check", *args, "--results", str(tmp_path / "r"),
                 env={"MMLAB_APT_MAX_AGE_S": str(10 ** 9)})
    assert done.returncode == 2, (what, done.stdout, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1 and re.search(wanted, done.stderr), \
        (what, done.stderr)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before    # no store, nothing built


SEED003 = ROOT / "experiments/patches/seed003-zap-set-referenced-6.12.patch"
UNMAP = ROOT / "experiments/suites/unmap-young-shmem.toml"
COMMENT = """\
From: mmlab <mmlab@example.org>
Subject: [PATCH] mm: say what a young PTE means when zapping

A comment only.
---
--- a/mm/memory.c
+++ b/mm/memory.c
@@ -1500,5 +1500,6 @@
 \t\t\t}
 \t\t}
+\t\t/* A young PTE: the folio was used since it was last aged. */
 \t\tif (pte_young(ptent) && likely(vma_has_recency(vma)))
 \t\t\tfolio_mark_accessed(folio);
 \t\trss[mm_counter(folio)] -= nr;
"""


@pytest.mark.slow
def test_seed_003s_patch_flags_the_unmap_path_and_no_other(tmp_path):
    """A real check in TCG guests against the kept 6.12 base (the tiny
    config: what is checked here is the check, not Debian's config, whose
    first base build takes hours on 2 cores; test_kbuild builds it): the patched
    build is an incremental one (30-90 s, a cache hit once made), then
    about 100 s of counting boots and the attribution here."""
    done = mmlab("check", str(SEED003), "--base", "debian-source:6.12", "--config", "tiny",
                 "--profile", str(UNMAP), "--results", str(tmp_path / "r"), "--json")
    assert done.returncode == 1, done.stderr
    record = json.loads(done.stdout)
    changed = {c["metric"]: c for c in record["changes"]}
    assert "unmap_kernel_insns_per_page" in changed, changed
    assert all(m.startswith("unmap_") for m in changed), changed     # the touch window stays
    assert {c["outcome"] for c in changed.values()} == {"improvement"}
    assert record["paths"] > len(changed) and record["patched"]["compiler"].startswith("gcc")
    moved = {r["function"] for c in changed.values() for w in c["functions"] for r in w["rows"]}
    assert "lru_activate" in moved          # folio_mark_accessed's activation is gone


@pytest.mark.slow
def test_a_comment_only_patch_reports_no_change(tmp_path):
    (tmp_path / "comment.patch").write_text(COMMENT)
    done = mmlab("check", str(tmp_path / "comment.patch"), "--base", "debian-source:6.12",
                 "--config", "tiny", "--profile", str(UNMAP), "--results", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"mmlab check: no change: [3-9] path\(s\) of 1 profile\(s\) checked on "
                        r"counts \(tcg guests, 4 rounds a kernel\) .*\n", done.stdout), done.stdout


SEED004 = ROOT / "experiments/patches/seed004-ksm-rmap-walk-range-6.12.patch"


@pytest.mark.slow
def test_seed_004s_patch_flags_the_ksm_rmap_paths_and_no_other(tmp_path):
    """Seed 004's patch against the kept 6.12 base, beside the broad
    suite's move_pages of plain anonymous pages: the same syscall through
    rmap_walk_anon, which the patch leaves alone.  The KSM walk's paths
    change, by rmap_walk_ksm's functions; no path of the anonymous
    migration does (a few minutes here, on the kept tiny base)."""
    done = mmlab("check", str(SEED004), "--base", "debian-source:6.12", "--config", "tiny",
                 "--profile", str(ROOT / "experiments/suites/ksm-rmap-move.toml"),
                 "--profile", str(ROOT / "experiments/suites/mm/migrate-move-pages.toml"),
                 "--results", str(tmp_path / "r"), "--json")
    assert done.returncode == 1, done.stderr
    record = json.loads(done.stdout)
    changed = {c["metric"]: c for c in record["changes"]}
    assert {c["profile"] for c in changed.values()} == {"track-ksm-rmap-move"}, changed
    assert "walk_kernel_insns_per_migrated_page" in changed, changed
    assert all(m == "walk_kernel_insns_per_migrated_page"
               or m.startswith("walk_syscall_move_pages_") for m in changed), changed
    assert {c["outcome"] for c in changed.values()} == {"improvement"}
    assert record["paths"] > len(changed) + 2 and not record["failed"]
    moved = {r["function"] for c in changed.values() for w in c["functions"] for r in w["rows"]}
    assert {"rmap_walk_ksm", "anon_vma_interval_tree_iter_next"} <= moved, moved


def git_tree(where: Path, release: str = "6.12", name: str = "linux") -> Path:
    """A kernel-shaped git tree of `release` (its Makefile's version) with a
    base commit and two more."""
    import subprocess
    tree = where / name
    (tree / "mm").mkdir(parents=True)
    major, minor = release.split(".")
    (tree / "Makefile").write_text(f"VERSION = {major}\nPATCHLEVEL = {minor}\nSUBLEVEL = 0\n"
                                   "EXTRAVERSION =\nall:\n")
    (tree / "Kconfig").write_text("")

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tree), "-c", "user.name=A Developer", "-c",
                        "user.email=dev@example.org", *args], check=True, capture_output=True)
    git("init", "-q")
    for n in range(3):
        (tree / "mm/vmscan.c").write_text(f"static int shrink(void)\n{{\n\treturn {n};\n}}\n")
        git("add", "-A")
        git("commit", "-q", "-m", f"mm: step {n}")
    return tree


def test_a_trees_commits_are_the_series_and_its_old_end_the_base(monkeypatch, tmp_path):
    from mmlab.kernels import kbuild
    tree = git_tree(tmp_path)
    faked(monkeypatch, {"local:p2"})
    checked_out = []
    monkeypatch.setattr(kbuild, "checkout", lambda t, commit: checked_out.append(commit) or t)
    done = invoke(tmp_path, "--tree", str(tree), "--commits", "HEAD~2..HEAD", "--json")
    assert done.exit_code == 1, done.output
    record = json.loads(done.stdout)
    assert [p["subject"] for p in record["patches"]] == ["mm: step 1", "mm: step 2"]
    assert [c["patch"] for c in record["changes"]] == [2]
    assert record["changes"][0]["commands"]["reproduce"].startswith(
        f"mmlab check --tree {tree} --commits HEAD~2..HEAD --profile ")
    assert len(checked_out) == 1 and len(checked_out[0]) == 40      # the base: HEAD~2


@pytest.mark.parametrize("args, wanted", [
    (["--commits", "HEAD~2..HEAD"], "--tree DIR --commits OLD..NEW go together"),
    (["--tree", "T", "--commits", "HEAD~2..HEAD", "--base", "debian-source:6.12"],
     "without PATCH files or --base"),
    (["--tree", "T", "--commits", "HEAD..HEAD"], "--commits HEAD..HEAD: no commits in that "
                                                 "range"),
    (["--tree", "N", "--commits", "HEAD~1..HEAD"], "not a git tree"),
    (["--tree", "O", "--commits", "HEAD~1..HEAD"], "the Debian catalog has no 4.9"),
])
def test_bad_commit_ranges_are_one_line(tmp_path, args, wanted):
    """Each refused in one line before anything is made: a release the
    catalog has no Debian config of is read from OLD's Makefile in git, not
    from a checkout of OLD in mmlab's cache."""
    from mmlab.kernels import kbuild
    tree = git_tree(tmp_path)
    old = git_tree(tmp_path, "4.9", "old")
    plain = tmp_path / "plain"
    (plain / "mm").mkdir(parents=True)
    (plain / "Makefile").write_text("all:\n")
    (plain / "Kconfig").write_text("")
    args = [{"T": str(tree), "N": str(plain), "O": str(old)}.get(a, a) for a in args]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    worktrees = sorted((kbuild.build_cache() / "worktrees").glob("*"))
    done = mmlab("check", *args, "--profile", str(ROOT / "experiments/suites/unmap-young-shmem.toml"),
                 "--results", str(tmp_path / "r"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert wanted in done.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert sorted((kbuild.build_cache() / "worktrees").glob("*")) == worktrees


def test_the_report_is_written_in_every_form_with_its_evidence(monkeypatch, tmp_path):
    out = tmp_path / "out"
    done = cli(monkeypatch, tmp_path, {"local:p2"}, False, "-o", str(out))
    assert done.exit_code == 1, done.output
    text = (out / "report.txt").read_text()
    assert text == done.stdout and text.startswith("[mm] mm: patch number 2: ")
    assert json.loads((out / "report.json").read_text())["changes"][0]["subject"] == \
        text.splitlines()[0]
    page = (out / "report.html").read_text()
    exp_id = json.loads((out / "report.json").read_text())["changes"][0]["experiment"]
    assert f'<h2 class="regression">{text.splitlines()[0]}</h2>' in page
    assert f'<a href="evidence/{exp_id}.html">' in page and "<th>%change</th>" in page
    assert (out / "evidence" / f"{exp_id}.html").is_file()
    assert (out / "evidence" / str(exp_id) / "MANIFEST.sha256").is_file()


def test_a_suites_profile_with_nothing_to_count_is_named_not_checked(tmp_path):
    (tmp_path / "p.toml").write_text(PROFILE)
    (tmp_path / "churn.toml").write_text(
        'name = "churn"\nworkload = "mremap-churn"\nrepetitions = 6\n'
        'metrics = ["ops_per_s_real"]\nbaseline = { kernel = "local:base" }\n[matrix]\n'
        'kernel = ["local:base"]\n')
    (tmp_path / "suite.toml").write_text(
        'name = "two"\nreference = "local:base"\nkernels = ["local:base"]\n'
        'metrics = ["advise_kernel_insns_per_page", "ops_per_s_real"]\n'
        '[[profile]]\npath = "p.toml"\n[[profile]]\npath = "churn.toml"\n')
    asked = requests.read([patch_file(tmp_path, 1, 1, "mm: one")], str(ROOT / "tests"),
                          tmp_path / "suite.toml", [])
    assert [t.name for t in asked.profiles] == ["pageout"] and asked.skipped == ["churn"]
    assert asked.profiles[0].metrics == ["advise_kernel_insns_per_page", "prefault_fault_calls"]
    fake = Counting(set())
    result = session.run(Store(tmp_path / "r"), asked, [kernel("local:base"), kernel("local:p1")],
                         driver.Here(TargetPool(make=lambda arm: fake, say=lambda m: None)),
                         str(tmp_path / "r"))
    assert robot.text(result).rstrip().endswith("; not checked, nothing to count: churn")


def test_the_syscall_paths_shown_are_those_the_change_names(tmp_path):
    """A window running a whole command has a path per syscall, most moved
    by what else ran: a change of one syscall's path shows that path, a
    window's change the three that moved most."""
    from dataclasses import replace

    from mmlab.attribution.explain import CallPath, WindowFunctions
    result, _ = checked(tmp_path, 1, {"local:p1"})
    moves = {"syscall_execve": -100.0, "syscall_mmap": 900.0, "syscall_read": 1.0,
             "syscall_munmap": -400.0, "fault": 50.0}
    window = WindowFunctions("kernel=local:p1", "kernel=local:base", "advise", "page", 1.0, 1.0,
                             0.0, [], paths=[CallPath(stay, f"entry_{stay}", 1000 + d, 1000.0,
                                                      None, None, [])
                                             for stay, d in moves.items()])
    f = result.found[0]
    f = replace(f, evidence=replace(f.evidence, functions=[window]))
    shown = [line.split(",")[0] for line in robot.functions([f])[1:]]
    assert shown == ["  syscall_mmap", "  syscall_munmap", "  syscall_execve"]
    named = replace(f, evidence=replace(f.evidence, change=replace(
        f.change, metric="advise_syscall_execve_kernel_insns_per_call")))
    assert [line.split(",")[0] for line in robot.functions([named])[1:]] == ["  syscall_execve"]


def test_an_mboxs_patches_are_written_for_the_build_and_apply_in_order(tmp_path):
    from mmlab.kernels import kbuild
    box = COVER
    for n in (1, 2):
        body = patch_file(tmp_path, n, 2, f"mm: step {n}").read_text()
        box += f"\nFrom mmlab Mon Sep 17 00:00:00 2001\n{body}"
    (tmp_path / "v1.mbox").write_text(box)
    asked = requests.read([tmp_path / "v1.mbox"], str(ROOT / "tests"), None,
                          [ROOT / "experiments/suites/unmap-young-shmem.toml"])
    assert [p.subject for p in asked.patches] == ["mm: step 1", "mm: step 2"]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    files = requests.patch_files(asked, scratch)
    assert [f.name for f in files] == ["0001.patch", "0002.patch"]
    assert files[1].read_text().startswith("Subject: [PATCH 2/2] mm: step 2\n")
    tree = tmp_path / "tree"
    (tree / "mm").mkdir(parents=True)
    (tree / "mm/vmscan.c").write_text("\n" * 9 + "static int shrink(void)\n{\n\treturn 1;\n}\n")
    kbuild.check_applies(tree, files)                     # 1 -> 2, then 2 -> 3
    assert asked.given == f"{tmp_path / 'v1.mbox'} --base {ROOT / 'tests'}"
    # format-patch files are given to the build as they are: a build of them is found
    # in the cache by their bytes
    one = [patch_file(tmp_path, 1, 1, "mm: one")]
    alone = requests.read(one, str(ROOT / "tests"), None,
                          [ROOT / "experiments/suites/unmap-young-shmem.toml"])
    assert requests.patch_files(alone, scratch) == one


def test_the_commands_config_default_is_the_builds(tmp_path, monkeypatch):
    """`mmlab check` without --config asks for kconfig.DEFAULT, the builds'
    default, rather than a copy of it of its own ("debian")."""
    from typer.testing import CliRunner

    from mmlab.cli import app
    from mmlab.kernels import kconfig
    asked = []

    def read(patches, base, suite, profiles, given=None, config=None):
        asked.append(config)
        raise MmlabError("stop here")
    monkeypatch.setattr(requests, "read", read)
    monkeypatch.setattr(kconfig, "DEFAULT", "debian-generic")
    done = CliRunner().invoke(app, ["check", str(tmp_path / "x.patch")])
    assert done.exit_code != 0 and asked == ["debian-generic"]
    CliRunner().invoke(app, ["check", str(tmp_path / "x.patch"), "--config", "tiny"])
    assert asked == ["debian-generic", "tiny"]


def test_the_broad_suite_is_the_default_from_any_directory(tmp_path, monkeypatch):
    """Without --suite a check reads the project's broad suite wherever it
    is run from (it read experiments/suites/mm.toml from the current
    directory: 'no such suite' anywhere but the project's root)."""
    monkeypatch.chdir(tmp_path)
    asked = requests.read([patch_file(tmp_path, 1, 1, "mm: one")], str(ROOT / "tests"), None, [])
    assert asked.suite == "mm" and len(asked.profiles) >= 20
