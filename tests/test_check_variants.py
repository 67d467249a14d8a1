"""Making the variants table (check/variants.py) with bad input or nothing
counted: the table shipped with mmlab is never overwritten by an empty one,
and a kernel the cache lacks is refused before a store is made."""

from __future__ import annotations

import json

import pytest

from mmlab.check import variants
from mmlab.errors import MmlabError
from mmlab.targets import TargetPool

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
