"""A check's coverage: the functions a series changes, placed in the base's
source (a real excerpt of 6.12's mm/memory.c, its zap path), where the base
kernel counts each (its own symbol, or the function it was inlined into),
which profiles' paths ran them, the variants that would run the others, the
kernels' functions compared for a change that only moves code, and every
form of the report saying it.  The check runs on the fake target."""

from __future__ import annotations

import difflib
import gzip
import json
import re
import shutil
from pathlib import Path

import pytest

from mmlab.attribution.functions import FunctionInsns
from mmlab.check import changes, coverage, reach, session, variants
from mmlab.check import request as requests
from mmlab.check.variants import Table, Variant
from mmlab.errors import MmlabError
from mmlab.kernels import series
from mmlab.kernels.images import Kernel
from mmlab.report import robot, robot_html
from mmlab.run import driver
from mmlab.store import Store
from mmlab.targets import TargetPool

from .fake_target import FakeTarget
from .test_check import PROFILE

DATA = Path(__file__).parent / "data"
EXCERPT = (DATA / "memory-6.12-zap.c").read_text()
# The base kernel's text symbols as 6.12's tiny build has them: the zap
# path's static functions are inlined into unmap_page_range, one helper
# has a copy of its own under the compiler's suffix.
SYMBOLS = ["_text", "unmap_page_range", "zap_install_uffd_wp_if_needed.isra.0",
           "folio_mark_accessed", "lru_activate", "_etext"]


def patch(subject: str, old: str, new: str, hint: str = "", n: int = 1, total: int = 1) -> str:
    """A format-patch mail of mm/memory.c from `old` to `new`, each hunk
    header with git's kind of hint: `hint`, the text before the hunk."""
    diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        "a/mm/memory.c", "b/mm/memory.c"))
    diff = re.sub(r"^(@@ [^@]+ @@)$", rf"\1 {hint}", diff, flags=re.M)
    return (f"From: A Developer <dev@example.org>\nSubject: [PATCH {n}/{total}] {subject}\n\n"
            f"Why.\n---\n{diff}")


def tree_of(where: Path) -> Path:
    tree = where / "linux"
    (tree / "mm").mkdir(parents=True)
    (tree / "mm/memory.c").write_text(EXCERPT)
    (tree / "Makefile").write_text("all:\n")
    (tree / "Kconfig").write_text("")
    return tree


def symbols_file(where: Path, names: list[str], grow: str = "") -> Path:
    """A gzipped System.map: each name 0x40 bytes long, `grow` 0x10 longer."""
    where.mkdir(parents=True, exist_ok=True)
    lines, at = [], 0xffffffff81000000
    for name in names:
        lines.append(f"{at:016x} T {name}")
        at += 0x40 + (0x10 if name == grow else 0)
    path = where / "symbols.gz"
    path.write_bytes(gzip.compress("\n".join(lines).encode() + b"\n"))
    return path


PADDED = [*SYMBOLS[:1], "mm_pad", *SYMBOLS[1:]]     # a function added: those after it move


def read(tmp_path: Path, *texts: str, tree: Path | None = None) -> changes.Changes:
    tmp_path.mkdir(parents=True, exist_ok=True)
    files = []
    for i, text in enumerate(texts, 1):
        files.append(tmp_path / f"{i:04d}.patch")
        files[-1].write_text(text)
    return changes.read(series.read(files), tree or tree_of(tmp_path),
                        symbols_file(tmp_path / "k", SYMBOLS))


@pytest.fixture(params=[changes.CTAGS, changes.BRACES])
def parser(request, monkeypatch):
    """Both ways of finding a function's extent."""
    if request.param == changes.BRACES:
        monkeypatch.setattr(shutil, "which", lambda name: None)
    return request.param


def test_a_hunk_is_placed_in_the_function_that_holds_it_not_in_gits_hint(tmp_path, parser):
    """Seed 003's change, git's hint naming another function (the one
    before the hunk, as git names it); and the type line of another
    function's signature, on a line of its own."""
    new = EXCERPT.replace("\t\t\tfolio_mark_accessed(folio);", "\t\t\tfolio_set_referenced(folio);")
    new = new.replace("static inline void\nzap_install_uffd_wp_if_needed(",
                      "static noinline void\nzap_install_uffd_wp_if_needed(")
    found = read(tmp_path, patch("mm: three hunks", EXCERPT, new, "static inline bool "
                                 "should_zap_cows(struct zap_details *details)"))
    assert found.parser == parser
    named = {c.function: c for c in found.functions}
    assert set(named) == {"zap_present_folio_ptes", "zap_install_uffd_wp_if_needed"}, named
    assert all(c.code and not c.new and c.patches == (1,) for c in named.values())
    # inlined: counted in unmap_page_range, through zap_present_ptes .. zap_p4d_range
    assert found.hosts["zap_present_folio_ptes"] == ["unmap_page_range"]
    assert found.symbols["zap_present_folio_ptes"] == ["unmap_page_range"]
    assert found.symbols["zap_install_uffd_wp_if_needed"] == \
        ["zap_install_uffd_wp_if_needed.isra.0"]


def test_a_comment_is_no_code_and_a_later_patch_reads_the_earlier_ones_lines(tmp_path, parser):
    comment = EXCERPT.replace("\t\tif (pte_young(ptent) && likely(vma_has_recency(vma)))",
                              "\t\t/* A young PTE: used since it was last aged. */\n"
                              "\t\tif (pte_young(ptent) && likely(vma_has_recency(vma)))")
    assert comment != EXCERPT
    found = read(tmp_path, patch("mm: a comment", EXCERPT, comment))
    assert [(c.function, c.code) for c in found.functions] == [("zap_present_folio_ptes", False)]
    assert found.why == {"zap_present_folio_ptes": "comments only"} and not found.symbols
    # patch 1 adds a function at the top, shifting every line; patch 2 changes
    # zap_pmd_range in the file as patch 1 left it
    added = EXCERPT.replace("static inline bool should_zap_cows(",
                            "static void mm_pad(void)\n{\n\tbarrier();\n}\n\n"
                            "static inline bool should_zap_cows(", 1)
    second = added.replace("\t\t\t\tcontinue;\n\t\t\t}\n\t\t\t/* fall through */",
                           "\t\t\t\tcontinue;\n\t\t\t}\n\t\t\tcond_resched();\n"
                           "\t\t\t/* fall through */")
    assert second != added
    found = read(tmp_path / "series", patch("mm: pad", EXCERPT, added, n=1, total=2),
                 patch("mm: resched", added, second, n=2, total=2))
    named = {c.function: c for c in found.functions}
    assert set(named) == {"mm_pad", "zap_pmd_range"}, named
    assert named["mm_pad"].new and named["mm_pad"].patches == (1,)
    assert not named["zap_pmd_range"].new and named["zap_pmd_range"].patches == (2,)
    assert found.why["mm_pad"] == "added by the series"
    assert found.hosts["zap_pmd_range"] == ["unmap_page_range"]


def test_without_the_base_source_gits_hint_names_the_function(tmp_path):
    new = EXCERPT.replace("\t\t\tfolio_mark_accessed(folio);", "\t\t\tfolio_set_referenced(folio);")
    (tmp_path / "p.patch").write_text(patch("mm: x", EXCERPT, new, "static inline void "
                                            "zap_present_folio_ptes(struct mmu_gather *tlb,"))
    found = changes.read(series.read([tmp_path / "p.patch"]), None, None)
    assert found.parser == "git's hunk headers"
    assert [c.function for c in found.functions] == ["zap_present_folio_ptes"]
    assert found.why == {"zap_present_folio_ptes": "no symbol in the base kernel (no source "
                                                   "to follow)"}


def seed003(tmp_path: Path) -> changes.Changes:
    new = EXCERPT.replace("\t\t\tfolio_mark_accessed(folio);", "\t\t\tfolio_set_referenced(folio);")
    new = new.replace("static inline void\nzap_install_uffd_wp_if_needed(",
                      "static noinline void\nzap_install_uffd_wp_if_needed(")
    return read(tmp_path, patch("mm: two functions", EXCERPT, new))


TABLE = Table("build:3ce798c85209", [
    Variant("mm-zap-munmap", "mm/zap-munmap.toml", "munmap-zap", {}),
    Variant("mm-madvise-cold", "mm/madvise-cold.toml", "madvise", {"advice": "free"}),
    Variant("mm-fork-cow", "mm/fork-cow.toml", "fork-cow", {})],
    {"zap_install_uffd_wp_if_needed": [1, 2], "unmap_page_range": [0, 1, 2]})


def test_reached_and_unreached_functions_and_the_variants_that_reach_them(tmp_path):
    counts = {"unmap": ({"unmap": {"unmap_page_range": 120.5, "lru_activate": 30.0}},
                        {"unmap": "page"}),
              "fault": ({"fault": {"handle_mm_fault": 900.0}}, {"fault": "page"})}
    cov = coverage.cover(seed003(tmp_path), counts, None, TABLE, {"mm-fork-cow"})
    by = {f.function: f for f in cov.functions}
    ran = by["zap_present_folio_ptes"]
    assert [(r.profile, r.window, r.insns, r.unit) for r in ran.reached] == \
        [("unmap", "unmap", 120.5, "page")] and not ran.suggestions
    missed = by["zap_install_uffd_wp_if_needed"]
    assert not missed.reached and missed.measurable and cov.unreached == [missed]
    # the suite's own profile fork-cow was checked as it is: only the variant is new
    assert [v.label for v in missed.suggestions] == ["mm-madvise-cold with advice=free"]
    assert cov.profiles == ["unmap", "fault"] and not coverage.needs_counts(
        read(tmp_path / "none", patch("mm: c", EXCERPT, EXCERPT.replace(
            "/* fall through */", "/* falls through */", 1))), None)


def test_a_layout_change_is_told_from_the_kernels_symbols(tmp_path):
    base = symbols_file(tmp_path / "a", SYMBOLS)
    same = coverage.compare(base, symbols_file(tmp_path / "b", SYMBOLS))
    assert same is not None and same.identical
    moved = coverage.compare(base, symbols_file(tmp_path / "c", PADDED))
    assert moved is not None and moved.resized == ["mm_pad"] and len(moved.moved) == 4
    grown = coverage.compare(base, symbols_file(tmp_path / "d", SYMBOLS,
                                                grow="unmap_page_range"))
    assert grown is not None and grown.resized == ["unmap_page_range"]
    counts = {"unmap": ({"unmap": {"unmap_page_range": 120.5}}, {"unmap": "page"})}
    cov = coverage.cover(seed003(tmp_path), counts, moved, None, set())
    assert cov.only_moved and cov.layout and cov.layout.ran == 1 and cov.layout.ran_moved == 1
    assert not coverage.cover(seed003(tmp_path / "g"), counts, grown, None, set()).only_moved
    assert coverage.compare(base, tmp_path / "nowhere.gz") is None


class Functions(FakeTarget):
    """Every arm's windows run unmap_page_range (and shrink_folio_list);
    kernels in `step_at` count more."""

    def __init__(self, step_at: set[str], hangs: bool = False):
        super().__init__(cv=0.001, model=lambda arm: (1.3 if arm.kernel in step_at else 1.0,
                                                      {}))
        self.attributed: list[str] = []
        self.hangs = hangs

    def attribute(self, arm, plan):
        self.attributed.append(arm.kernel)
        if self.hangs:
            raise MmlabError(f"guest hung: no result from {arm.kernel} after 600 s")
        advise = {"unmap_page_range": 120.5, "shrink_folio_list": 400.0}
        return {"functions": FunctionInsns(
            windows={"advise": advise}, kernel={"advise": sum(advise.values())},
            unresolved={"advise": 0.0}, units={"advise": "page"}, kernel_release="fake",
            text_address=0).model_dump()}


def built(where: Path, name: str, key: str, names: list[str] = SYMBOLS, grow: str = "") -> Kernel:
    symbols_file(where / name, names, grow)
    return Kernel(name=f"build:{name}", version="6.12.118", source="debian-source:6.12",
                  config_sha256="c0ffee" * 10, dir=str(where / name),
                  details={"source": "debian-source:6.12 6.12.118-1", "build_key": key,
                           "compiler": "gcc (Debian 14.2.0-19) 14.2.0"})


def check(tmp_path: Path, monkeypatch, text: str, step_at: set[str], hangs: bool = False,
          **patched):
    """A check of one patch on the fake, its kernels with symbol tables,
    the base's source `tree`, mmlab's cache under tmp_path, TABLE the
    variants."""
    monkeypatch.setattr(requests, "check_base", lambda spec: None)
    monkeypatch.setattr(variants, "load", lambda: TABLE)
    monkeypatch.setenv("MMLAB_KERNEL_CACHE", str(tmp_path / "cache/kernels"))
    tree = tmp_path / "linux" if (tmp_path / "linux").is_dir() else tree_of(tmp_path)
    (tmp_path / "p.toml").write_text(PROFILE)
    (tmp_path / "one.patch").write_text(text)
    asked = requests.read([tmp_path / "one.patch"], str(tree), None, [tmp_path / "p.toml"])
    fake = Functions({"build:patched"} & step_at, hangs)
    kernels = [built(tmp_path / "k", "base", "b" * 64),
               built(tmp_path / "k", "patched", "p" * 64, **patched)]
    result = session.run(Store(tmp_path / "r"), asked, kernels,
                         driver.Here(TargetPool(make=lambda arm: fake, say=lambda m: None)),
                         str(tmp_path / "r"))
    return result, fake


TWO = patch("mm: two functions", EXCERPT, EXCERPT.replace(
    "\t\t\tfolio_mark_accessed(folio);", "\t\t\tfolio_set_referenced(folio);").replace(
    "static inline void\nzap_install_uffd_wp_if_needed(",
    "static noinline void\nzap_install_uffd_wp_if_needed("))


def test_no_change_says_which_changed_functions_ran_and_which_were_not_measured(
        tmp_path, monkeypatch):
    result, fake = check(tmp_path, monkeypatch, TWO, set(), grow="unmap_page_range")
    assert fake.attributed == ["build:base"]          # the base counted, once, by function
    lines = robot.text(result).splitlines()
    assert lines[0].startswith("mmlab check: no change: ")
    assert lines[0].endswith("; the changed functions the paths ran did not move: "
                             "zap_present_folio_ptes (inlined into unmap_page_range) "
                             "(pageout advise 120.5/page)"), lines[0]
    assert lines[1] == ("not measured: the check's paths did not run these changed functions "
                        "(or it cannot tell), so no change there means not measured:")
    assert lines[2] == ("  zap_install_uffd_wp_if_needed (mm/memory.c, patch 1); run by "
                        "mm-fork-cow, mm-madvise-cold with advice=free")
    record = robot.record(result)["coverage"]
    by = {f["function"]: f for f in record["functions"]}
    assert by["zap_present_folio_ptes"]["reached"] == [
        {"profile": "pageout", "window": "advise", "insns": 120.5, "unit": "page"}]
    assert by["zap_present_folio_ptes"]["resized"] is True
    assert by["zap_install_uffd_wp_if_needed"]["reached"] == []
    assert record["layout"]["ran_resized"] == ["unmap_page_range"]
    page = robot_html.render(result)
    assert "not measured: the check&#x27;s paths did not run" in page and "did not move: " in page
    # a second check against the kept base counts nothing again
    cached = reach.cache_file(built(tmp_path / "k", "base", "b" * 64), result.request.profiles[0])
    assert cached is not None and cached.is_file()
    (tmp_path / "r").rename(tmp_path / "r1")
    again, fake = check(tmp_path, monkeypatch, TWO, set(), grow="unmap_page_range")
    assert fake.attributed == [] and robot.text(again) == robot.text(result)


def test_a_patch_that_only_moves_code_is_said_to(tmp_path, monkeypatch):
    pad = patch("mm: pad", EXCERPT, EXCERPT.replace(
        "static inline bool should_zap_cows(",
        "static noinline void mm_pad(void)\n{\n\tbarrier();\n}\n\n"
        "static inline bool should_zap_cows(", 1))
    result, fake = check(tmp_path, monkeypatch, pad, set(), names=PADDED)
    line = robot.text(result)
    assert line.count("\n") == 1 and fake.attributed == ["build:base"]
    assert line.rstrip().endswith("; where the paths run the series only moves code: none of "
                                  "the 2 functions they ran changed size, 1 lie at new "
                                  "addresses (a layout change; instruction counts do not see "
                                  "one)"), line
    comment = patch("mm: a comment", EXCERPT, EXCERPT.replace(
        "/* fall through */", "/* falls through */", 1))
    shutil.rmtree(tmp_path / "r")
    result, fake = check(tmp_path, monkeypatch, comment, set())
    assert not fake.attributed                         # nothing to count: no code changed
    assert robot.text(result).rstrip().endswith(
        "the patched kernel's functions are the base's, each at its address and size: the "
        "series changes no compiled code")


def test_a_change_is_followed_by_the_coverage(tmp_path, monkeypatch):
    result, fake = check(tmp_path, monkeypatch, TWO, {"build:patched"}, grow="unmap_page_range")
    assert result.changed
    text = robot.text(result)
    block = text[text.index("coverage: "):].splitlines()
    assert block[0] == ("coverage: the functions the series changes (universal-ctags), and the "
                        "paths that ran them on the base kernel:")
    assert block[1] == ("  zap_install_uffd_wp_if_needed (mm/memory.c, patch 1): no path ran "
                        "it, not measured; run by mm-fork-cow, mm-madvise-cold with "
                        "advice=free"), block[1]
    assert block[2] == ("  zap_present_folio_ptes (inlined into unmap_page_range) "
                        "(mm/memory.c): ran in pageout advise 120.5/page")
    assert sorted(fake.attributed) == ["build:base", "build:patched"]   # the confirmation's
    page = robot_html.render(result)
    assert "<h2>Coverage</h2>" in page
    assert json.loads(json.dumps(robot.record(result)))["coverage"]["parser"] == \
        "universal-ctags"


class ByParams(FakeTarget):
    """Each arm's windows run a function named after each of its params."""

    def attribute(self, arm, plan):
        ran = {f"run_{k}_{v}".replace("-", "_"): 1.0 for k, v in arm.params.items()}
        window = plan.workload.windows[0]
        return {"functions": FunctionInsns(
            windows={window.name: ran}, kernel={window.name: float(len(ran))},
            unresolved={window.name: 0.0}, units={window.name: window.unit},
            kernel_release="fake", text_address=0).model_dump()}


def test_the_variants_table_is_made_from_the_suites_profiles_and_their_choices(
        tmp_path, monkeypatch):
    import mmlab.targets
    fake = ByParams()
    monkeypatch.setattr(mmlab.targets, "TargetPool", lambda *a, **k: TargetPool(
        make=lambda arm: fake, say=lambda m: None))
    out = tmp_path / "variants.json"
    variants.generate("local:base", str(tmp_path / "r"), out)
    table = variants.load(out)
    assert table is not None and table.kernel == "local:base"
    labels = [v.label for v in table.variants]
    assert "mm-madvise-cold with advice=free" in labels and "mm-madvise-free" in labels
    assert not any("align=" in label for label in labels)        # placement, not code
    free = labels.index("mm-madvise-cold with advice=free")
    assert free in table.functions["run_advice_free"]
    # the suite's own profile first (then the profiles as they are, the reach
    # profiles among them, then the variants); a profile checked as it is left out
    assert [v.label for v in table.reaching(["run_advice_free"])] == \
        ["mm-madvise-free", "reach-madvise-free-thp", "mm-madvise-cold with advice=free"]
    assert "mm-madvise-free" not in [v.label for v in table.reaching(["run_advice_free"],
                                                                      {"mm-madvise-free"})]
    assert json.loads(out.read_text())["command"] == \
        "python -m mmlab.check.variants --kernel local:base"


def test_a_header_inline_is_said_to_be_not_known(tmp_path):
    from types import SimpleNamespace
    tree = tree_of(tmp_path)
    header = "static inline int mm_helper(int x)\n{\n\treturn x + 1;\n}\n"
    (tree / "mm/helper.h").write_text(header)
    diff = "".join(difflib.unified_diff(header.splitlines(True), header.replace(
        "x + 1", "x + 2").splitlines(True), "a/mm/helper.h", "b/mm/helper.h"))
    (tmp_path / "h.patch").write_text("Subject: [PATCH] mm: h\n\n---\n" + diff)
    found = changes.read(series.read([tmp_path / "h.patch"]), tree,
                         symbols_file(tmp_path / "k", SYMBOLS))
    cov = coverage.cover(found, {}, None, None, set())
    assert cov.unknown == cov.functions and not cov.unreached
    assert robot.not_measured(SimpleNamespace(coverage=cov))[1:] == [
        "  mm_helper (mm/helper.h): not known: inline in a header: its callers are not followed"]


def test_a_profile_whose_base_could_not_be_counted_is_named(tmp_path, monkeypatch):
    """A counting boot that hangs leaves the profile's functions unknown:
    what only it runs shows as not run, and the report says so."""
    result, fake = check(tmp_path, monkeypatch, TWO, set(), hangs=True, grow="unmap_page_range")
    assert fake.attributed == ["build:base"] and result.coverage is not None
    assert result.coverage.uncounted == ["pageout"] and not result.coverage.profiles
    assert robot.text(result).splitlines()[-1] == (
        "  (the base could not be counted by function in pageout: what only they run is "
        "listed as not run)")
    assert robot.record(result)["coverage"]["uncounted"] == ["pageout"]
