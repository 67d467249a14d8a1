"""Making the variants table (check/variants.py) with bad input or nothing
counted: the table shipped with mmlab is never overwritten by an empty one,
and a kernel the cache lacks is refused before a store is made."""

from __future__ import annotations

import gzip
import json

import pytest

from mmlab.check import variants
from mmlab.errors import MmlabError
from mmlab.targets import TargetPool
from mmlab.workloads.build import REPO_ROOT

from .fake_target import FakeTarget

KEPT = {"kernel": "build:3ce798c85209", "variants": [], "functions": {"zap_pte_range": [0]}}


def test_a_kernel_the_cache_lacks_is_refused_before_anything_is_made(tmp_path):
    """It ran every plan, each failing, stored them all, wrote a table of
    no variant over the one given (by default the shipped table) and
    exited 0."""
    out = tmp_path / "variants.json"
    out.write_text(json.dumps(KEPT))
    with pytest.raises(MmlabError, match=r"unknown kernel 'build:nope'"):
        variants.generate("build:nope", str(tmp_path / "r"), out)
    assert not (tmp_path / "r").exists() and json.loads(out.read_text()) == KEPT


class Uncounted(FakeTarget):
    """A target whose counting boots give no counts by function (a boot
    that hung, as the reclaim profiles' did)."""

    def attribute(self, arm, plan):
        return {}


def test_a_run_that_counted_nothing_leaves_the_table_as_it_was(tmp_path, monkeypatch):
    import mmlab.targets
    every = variants.plans
    monkeypatch.setattr(variants, "plans", lambda kernel: every(kernel)[:2])
    monkeypatch.setattr(mmlab.targets, "TargetPool", lambda *a, **k: TargetPool(
        make=lambda arm: Uncounted(), say=lambda m: None))
    out = tmp_path / "variants.json"
    out.write_text(json.dumps(KEPT))
    with pytest.raises(MmlabError, match=r"no variant was counted on local:base: "
                                         rf"{out} is left as it was"):
        variants.generate("local:base", str(tmp_path / "r"), out)
    assert json.loads(out.read_text()) == KEPT


def test_the_suites_are_found_and_named_from_any_directory(tmp_path, monkeypatch):
    """`python -m mmlab.check.variants` read its suite relative to the
    current directory: from anywhere but the project's root it failed to
    find it.  The table names each profile relative to the project, as the
    shipped one does."""
    monkeypatch.chdir(tmp_path)
    suite, extra = variants.profiles()
    assert suite and extra
    named = {variants.shown(t.plan.path) for t in suite + extra}
    assert all(not n.startswith("/") and (REPO_ROOT / n).is_file() for n in named)
    shipped = {v["path"] for v in json.loads(variants.TABLE.read_text())["variants"]}
    assert named & shipped
    assert variants.shown("/elsewhere/x.toml") == "/elsewhere/x.toml"


def test_a_clone_is_its_function_wherever_a_symbol_is_named(tmp_path):
    """One helper strips a compiler's clone suffix for the series, the
    changes' symbols, the coverage and the variants table (each had its
    own split)."""
    from mmlab.attribution.functions import function_of
    from mmlab.check.changes import symbol_names
    clones = ["zap_pte_range", "zap_pte_range.isra.0", "zap_pte_range.constprop.0",
              "zap_pte_range.part.0", "zap_pte_range.cold"]
    assert {function_of(s) for s in clones} == {"zap_pte_range"}
    system_map = tmp_path / "symbols.gz"
    system_map.write_bytes(gzip.compress("".join(
        f"ffffffff8100{k:04x} t {s}\n" for k, s in enumerate(["_text", *clones])).encode()))
    assert symbol_names(system_map)["zap_pte_range"] == clones


REACH = REPO_ROOT / "experiments/suites/reach"


class Counting(FakeTarget):
    """A target whose counting boots ran `functions` in an advise window,
    and that remembers which workloads it counted."""

    def __init__(self, functions: dict[str, float]):
        super().__init__()
        self.functions = functions
        self.counted: list[str] = []

    def attribute(self, arm, plan):
        self.counted.append(plan.profile.name)
        return {"functions": {"windows": {"advise": self.functions}}}


def _counting(monkeypatch, functions: dict[str, float]) -> Counting:
    import mmlab.targets
    target = Counting(functions)
    monkeypatch.setattr(mmlab.targets, "TargetPool", lambda *a, **k: TargetPool(
        make=lambda arm: target, say=lambda m: None))
    return target


def _table(kernel: str = "local:base") -> dict:
    return {"kernel": kernel, "made": "2026-11-01", "command": "kept", "variants": [
        {"profile": "mm-zap-munmap", "path": "experiments/suites/mm/zap-munmap.toml",
         "workload": "munmap-zap", "set": {}},
        {"profile": "reach-madvise-free-thp", "path": "experiments/suites/reach/"
         "madvise-free-thp.toml", "workload": "madvise", "set": {}}],
        "functions": {"zap_pte_range": [0], "madvise_free_pte_range": [0, 1],
                      "stale_function": [1]}}


def test_add_counts_only_the_profiles_given_and_keeps_the_rest(tmp_path, monkeypatch):
    """Adding a variant meant counting all 80 again (an hour): `--add`
    counts only the profiles given, replaces a variant counted before (its
    old functions gone) and keeps every other as it was."""
    target = _counting(monkeypatch, {"madvise_free_huge_pmd": 0.2, "folio_mark_lazyfree": 1.8,
                                     "never_ran": 0.0})
    out = tmp_path / "variants.json"
    out.write_text(json.dumps(_table()))
    variants.add("local:base", str(tmp_path / "r"), out,
                 [REACH / "madvise-free-thp.toml", REACH / "madvise-remove-shmem.toml"])
    assert target.counted == ["reach-madvise-free-thp", "reach-madvise-remove-shmem"]
    table = variants.load(out)
    assert table is not None and table.kernel == "local:base"
    assert [v.profile for v in table.variants] == [
        "mm-zap-munmap", "reach-madvise-free-thp", "reach-madvise-remove-shmem"]
    assert table.functions == {"zap_pte_range": [0], "madvise_free_pte_range": [0],
                               "madvise_free_huge_pmd": [1, 2], "folio_mark_lazyfree": [1, 2]}
    assert [v.label for v in table.reaching(["madvise_free_huge_pmd"])] == [
        "reach-madvise-free-thp", "reach-madvise-remove-shmem"]
    assert json.loads(out.read_text())["added"] == [
        "experiments/suites/reach/madvise-free-thp.toml",
        "experiments/suites/reach/madvise-remove-shmem.toml"]


@pytest.mark.parametrize("kept, message", [
    (None, r"no table to add to: make one with python -m mmlab.check.variants --kernel "
           r"local:base"),
    (_table("build:other"), r"--kernel local:base: .* was counted on build:other"),
])
def test_add_refuses_a_missing_table_or_another_kernels_before_counting(
        tmp_path, monkeypatch, kept, message):
    target = _counting(monkeypatch, {"f": 1.0})
    out = tmp_path / "variants.json"
    if kept:
        out.write_text(json.dumps(kept))
    with pytest.raises(MmlabError, match=message):
        variants.add("local:base", str(tmp_path / "r"), out, [REACH / "madvise-free-thp.toml"])
    assert not target.counted and not (tmp_path / "r").exists()
    assert (json.loads(out.read_text()) == kept) if kept else not out.exists()


def test_add_refuses_a_profile_that_does_not_load_before_counting(tmp_path, monkeypatch):
    target = _counting(monkeypatch, {"f": 1.0})
    out = tmp_path / "variants.json"
    out.write_text(json.dumps(_table()))
    with pytest.raises(MmlabError, match=r"nope\.toml"):
        variants.add("local:base", str(tmp_path / "r"), out,
                     [REACH / "madvise-free-thp.toml", tmp_path / "nope.toml"])
    assert not target.counted and not (tmp_path / "r").exists()
    assert json.loads(out.read_text()) == _table()


def test_every_reach_profile_says_what_it_reaches_and_is_in_the_shipped_table():
    """A reach profile is worth its file only where the table a check
    suggests from holds its counts."""
    reach = sorted(REACH.glob("*.toml"))
    assert reach and set(reach) <= set(variants.EXTRA)
    shipped = variants.load()
    assert shipped is not None
    counted = {v.path for v in shipped.variants if not v.set}
    for path in variants.EXTRA:
        assert path.read_text().startswith("# "), path
        assert variants.shown(str(path)) in counted, path


def test_a_profile_of_several_arms_is_one_variant_of_what_any_arm_ran(tmp_path, monkeypatch):
    """The arms of a profile counted as it is share its label: the last
    arm's functions replaced the others'."""
    import mmlab.targets

    class ByArm(Counting):
        def attribute(self, arm, plan):
            return {"functions": {"windows": {"advise": {f"ran_{arm.values['swap'][5:]}": 1.0}}}}
    target = ByArm({})
    monkeypatch.setattr(mmlab.targets, "TargetPool", lambda *a, **k: TargetPool(
        make=lambda arm: target, say=lambda m: None))
    profile = tmp_path / "two.toml"
    profile.write_text((REACH / "pageout-refault-swap.toml").read_text().replace(
        'swap = ["zram:512M"]', 'swap = ["zram:256M", "zram:512M"]'))
    out = tmp_path / "variants.json"
    out.write_text(json.dumps(_table()))
    variants.add("local:base", str(tmp_path / "r"), out, [profile])
    table = variants.load(out)
    assert table is not None and len(table.variants) == 3
    assert table.functions["ran_256M"] == table.functions["ran_512M"] == [2]
