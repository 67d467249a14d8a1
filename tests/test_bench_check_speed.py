"""`make bench-check`'s account of where a check's time went
(bench/check_speed.py), read from a stand-in store: every second of the
check is counted once, in one part, however many experiments ran at once."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from mmlab.bench import check_speed
from mmlab.kernels import images


class Store:
    """What check_speed.spent reads of a store: each experiment's creation,
    why it ran (its derived profile's note), its trials' spans and its
    last attribution record."""

    def __init__(self, experiments: dict[int, tuple[str, float, list[tuple[float, float]],
                                                    float | None]]):
        self.rows = experiments

    def experiment(self, exp_id):
        return {"created": self.rows[exp_id][1]}

    def plan(self, exp_id):
        derived = f"check 0001-x.patch {self.rows[exp_id][0]} p; derived from p.toml"
        return SimpleNamespace(profile=SimpleNamespace(derived=derived))

    def trials(self, exp_id):
        return [SimpleNamespace(started=a, ended=b) for a, b in self.rows[exp_id][2]]

    def measurements(self, exp_id):
        return SimpleNamespace(trials=[])

    def attributed_at(self, exp_id):
        return self.rows[exp_id][3]


def record(*experiments: int) -> dict:
    """A check's JSON record, as much of it as the bench reads."""
    return {"base": {"name": "build:base"}, "patched": {"name": "build:x"},
            "experiments": list(experiments), "changes": [], "unconfirmed": [], "failed": [],
            "paths": 3, "profiles": ["p"]}


@pytest.fixture(autouse=True)
def patched_kernel(monkeypatch):
    monkeypatch.setattr(images, "get", lambda name: SimpleNamespace(details={"make_s": 5.0}))


def test_experiments_that_ran_at_once_over_a_fleet_are_counted_once():
    """Two machines: both first looks at once (10-100 and 10-110 s), both
    confirmations at once (120-200 s), each explained here until 260 s;
    the check ended at 270 s.  The first looks took 100 s of the check,
    not 190; the parts add up to the whole, the rest is what none holds."""
    store = Store({1: ("first", 10.0, [(10.0, 50.0), (50.0, 100.0)], None),
                   2: ("first", 10.0, [(10.0, 110.0)], None),
                   3: ("confirm", 120.0, [(120.0, 200.0)], 250.0),
                   4: ("confirm", 120.0, [(120.0, 190.0)], 260.0)})
    s = check_speed.spent(store, record(1, 2, 3, 4), 0.0, 270.0)
    assert (s.before, s.phases, s.attribution) == (10.0, {"first": 100.0, "confirm": 80.0}, 60.0)
    assert s.rest == pytest.approx(20.0)
    assert (s.experiments, s.trials) == ({"first": 2, "confirm": 2}, {"first": 3, "confirm": 2})


def test_one_after_another_each_experiment_counts_whole():
    store = Store({1: ("first", 30.0, [(30.0, 90.0)], None),
                   2: ("first", 95.0, [(95.0, 150.0)], None),
                   3: ("confirm", 160.0, [(160.0, 220.0)], 240.0)})
    s = check_speed.spent(store, record(1, 2, 3), 0.0, 250.0)
    assert (s.make, s.before, s.phases, s.attribution) == (
        5.0, 30.0, {"first": 115.0, "confirm": 60.0}, 20.0)
    assert s.rest == pytest.approx(25.0)


def test_a_fleets_store_keeps_the_figures_in_a_folder_here(monkeypatch, tmp_path, capsys):
    """Over a fleet the check's results are a postgresql:// store, no
    folder: the figures go to a new folder under the bench's own, and the
    check's argv keeps the store's URL out of them (it holds a password)."""
    ran = []
    monkeypatch.setattr(check_speed, "run_check", lambda argv: ran.append(argv) or (
        SimpleNamespace(returncode=0, stdout=json.dumps(record())), 0.0, [1.0]))
    monkeypatch.setattr(check_speed, "Store", lambda *a, **k: Store({}))
    monkeypatch.setattr(check_speed, "FIGURES", tmp_path / "figures")
    url = "postgresql://mmlab:SECRET@storehost/mmlab"
    check_speed.main(["--results", url, "--check-option=--machines", "--check-option=a,b"])
    assert ran[0][ran[0].index("--results") + 1] == url
    (folder,) = (tmp_path / "figures").iterdir()
    assert json.loads((folder / "check.json").read_text()) == record()
    figures = (folder / "check-speed.json").read_text()
    assert "SECRET" not in figures and json.loads(figures)["seconds"] >= 0
    assert "SECRET" not in capsys.readouterr().out


def test_the_fresh_copy_keeps_a_folded_subject_whole(tmp_path):
    """git format-patch folds a long subject over lines; the bench's own
    line goes in at a header's start, so the check reads the same subject
    (and the same diff) from the copy's new bytes."""
    import email
    import email.policy
    folded = ("From 3f2a Mon Sep 17 00:00:00 2001\nFrom: A <a@example.org>\n"
              "Subject: [PATCH v3 2/7] mm/ksm: walk only the range of the rmap item's\n"
              " anon_vma that can map the page\n\nWhy.\n---\n mm/ksm.c | 2 +-\n\n"
              "diff --git a/mm/ksm.c b/mm/ksm.c\n--- a/mm/ksm.c\n+++ b/mm/ksm.c\n")
    (tmp_path / "in").mkdir()
    patch = tmp_path / "in" / "0002-ksm.patch"
    patch.write_text(folded)
    copy = check_speed.fresh_copy(patch, tmp_path)

    def read(p):
        return email.message_from_bytes(p.read_bytes(), policy=email.policy.default)
    assert copy.read_bytes() != patch.read_bytes()
    assert " ".join(str(read(copy)["Subject"]).split()) == (
        "[PATCH v3 2/7] mm/ksm: walk only the range of the rmap item's anon_vma that can map "
        "the page")
    assert read(copy).get_content() == read(patch).get_content()


def test_a_base_built_by_the_check_is_its_own_part_not_mmlabs_start(monkeypatch, tmp_path):
    """The benchmark is of a check against a kept base; on a fresh cache
    the check builds the base first, and its make (minutes with tinyconfig,
    hours with Debian's) was shown as mmlab's start.  It is a part of its
    own, and the whole is said not to be the benchmark's."""
    from mmlab.kernels import kbuild
    monkeypatch.setenv("MMLAB_KERNEL_CACHE", str(tmp_path / "cache" / "kernels"))
    kernels = {"build:base": SimpleNamespace(details={"make_s": 300.0, "build_key": "k" * 64}),
               "build:x": SimpleNamespace(details={"make_s": 5.0, "build_key": "p" * 64})}
    monkeypatch.setattr(images, "get", kernels.__getitem__)
    store = Store({1: ("first", 400.0, [(400.0, 500.0)], None)})
    outputs = kbuild.base_dir("k" * 64) / "outputs"
    outputs.parent.mkdir(parents=True)
    outputs.write_text("vmlinux\n")
    os.utime(outputs, (50.0, 50.0))                   # kept before the check began
    kept = check_speed.spent(store, record(1), 100.0, 520.0)
    assert kept.base_make is None
    os.utime(outputs, (390.0, 390.0))                 # made by the check itself
    built = check_speed.spent(store, record(1), 100.0, 520.0)
    assert built.base_make == 300.0
    rows = check_speed.table(built, record(1), [1.0], "t", True).columns[0]._cells
    assert "the base's build (it was not kept)" in rows
    shown = check_speed.table(built, record(1), [1.0], "t", True).columns[3]._cells
    assert any("not a check against a kept base" in what for what in shown)


def test_a_stores_last_attribution_is_when_it_was_stored(tmp_path):
    """What the bench reads of a real store: none before attribution, then
    the time of the last record stored."""
    import time

    from mmlab.experiment.plan import parse
    from mmlab.store import Store as Real

    from .test_count_rule import PROFILE
    store = Real(tmp_path / "r")
    exp_id = store.create_experiment(parse(PROFILE, "p.toml"))
    assert store.attributed_at(exp_id) is None
    before = time.time()
    arm = store.plan(exp_id).arms[0].name
    store.save_attribution(exp_id, arm, "functions", {})
    assert before <= (store.attributed_at(exp_id) or 0.0) <= time.time()


def test_the_coverages_counting_is_its_own_part_not_attribution():
    """The coverage counts the base by function on each first look's base
    arm once the confirmations are done (stored with the first look); that
    span, from the first look's end to its record, held the confirmations,
    their attribution and the judging too, and was shown as attribution.
    Coverage is the check's own measure of it, attribution the
    confirmations' records."""
    store = Store({1: ("first", 10.0, [(10.0, 100.0)], 400.0),
                   2: ("confirm", 110.0, [(110.0, 200.0)], 260.0)})
    checked = {**record(1, 2), "coverage": {"seconds": 120.0}}
    s = check_speed.spent(store, checked, 0.0, 420.0)
    assert (s.phases, s.attribution, s.coverage) == ({"first": 90.0, "confirm": 90.0}, 60.0,
                                                     120.0)
    assert s.rest == pytest.approx(420.0 - 10.0 - 180.0 - 60.0 - 120.0)
    parts = check_speed.table(s, checked, [1.0], "t", False).columns[0]._cells
    assert "coverage (the base counted by function)" in parts


def test_local_workers_are_a_fleet_the_check_is_spread_over(monkeypatch, tmp_path):
    """`--workers 2`: a private store and broker and two real `mmlab
    worker`s, registered and answering before the check starts, the check
    given their store and names, and every worker ended after it."""
    from mmlab.fleet import registry
    from mmlab.store import Store as RealStore
    seen = []

    def check(argv):
        url = argv[argv.index("--results") + 1]
        seen.append((argv, sorted(registry.machines(RealStore(url)))))
        return SimpleNamespace(returncode=0, stdout=json.dumps(record())), 0.0, [1.0]
    monkeypatch.setattr(check_speed, "run_check", check)
    monkeypatch.setattr(check_speed, "Store", lambda *a, **k: Store({}))
    monkeypatch.setattr(check_speed, "FIGURES", tmp_path / "figures")
    check_speed.main(["--workers", "2"])
    ((argv, machines),) = seen
    assert argv[argv.index("--machines") + 1] == "local1,local2" and machines == argv[
        argv.index("--machines") + 1].split(",")
    assert not [p for p in os.listdir("/proc") if b"--name\x00local1" in cmdline(p)]


def cmdline(pid: str) -> bytes:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read() if pid.isdigit() else b""
    except OSError:              # ended meanwhile
        return b""


@pytest.mark.parametrize("args", [["--workers", "-1"], ["--workers", "2", "--results", "r"],
                                  ["--workers", "2", "--check-option=--machines",
                                   "--check-option=a"]])
def test_local_workers_make_their_own_fleet(args, capsys):
    with pytest.raises(SystemExit) as stop:
        check_speed.main(args)
    assert "--workers" in str(stop.value.code)
