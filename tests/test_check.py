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
