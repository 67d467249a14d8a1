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
