"""The release tracker on the fake target: cells measured once per version,
a step found and confirmed by re-measuring its pair, nothing measured a
second time, the dashboard drawn in Chromium; its suite's bad input; and
the change points' operating characteristics with a fixed seed."""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mmlab.errors import MmlabError
from mmlab.store import Store
from mmlab.targets import TargetPool
from mmlab.track import dashboard, session, simulate, suite

from .conftest import mmlab
from .fake_target import FakeTarget

ROOT = Path(__file__).resolve().parents[1]
PROFILE = """
name = "pageout"
workload = "pageout-refault"
repetitions = 6
metrics = ["advise_ns_per_page"]
baseline = { kernel = "local:a" }
[params]
mapping-kb = 1024
[matrix]
kernel = ["local:a"]
"""
SUITE = """
name = "fake"
reference = "local:a"
kernels = ["local:a", "local:b", "local:c", "local:d", "local:e"]
metrics = ["advise_ns_per_page", "cycle_ns_per_page"]
[[profile]]
path = "p.toml"
"""
STEP_AT = {"local:c", "local:d", "local:e"}      # 30% slower from c on


def write_suite(tmp_path: Path, text: str = SUITE, profile: str = PROFILE) -> Path:
    (tmp_path / "p.toml").write_text(profile)
    path = tmp_path / "suite.toml"
    path.write_text(text)
    return path


def fake_pool() -> tuple[TargetPool, FakeTarget]:
    fake = FakeTarget(cv=0.01, model=lambda arm: (1.3 if arm.kernel in STEP_AT else 1.0, {}))
    return TargetPool(make=lambda arm: fake), fake


def version(kernel: str) -> str:
    return "1.0"


def test_a_step_is_found_confirmed_and_shown(tmp_path, chromium):
    found = suite.load(write_suite(tmp_path))
    store = Store(tmp_path / "r")
    pool, fake = fake_pool()
    first = session.run(store, found, pool, refresh=False, say=lambda m: None, version=version)
    assert len(first.measured) == 4                  # b..e against a
    assert len(first.confirmations) >= 1
    (change,) = [c for c in first.changes if c.metric == "advise_ns_per_page" and c.confirmed]
    assert (change.before, change.after, change.outcome) == ("local:b", "local:c", "regression")
    assert change.confirmation.ratio == pytest.approx(1.3, rel=0.05)

    trials = len(fake.trials)
    again = session.run(store, found, pool, refresh=False, say=lambda m: None, version=version)
    assert (again.measured, again.confirmations, len(fake.trials)) == ([], [], trials)
    assert [c.id for c in again.changes if c.confirmed] == [c.id for c in first.changes
                                                              if c.confirmed]

    text = dashboard.text(found, again)
    assert f"[{change.id}] pageout: advise_ns_per_page regression between local:b and local:c" \
        in text
    out = dashboard.write(tmp_path / "dash", found, again)
    page = (tmp_path / "dash" / "index.html").read_text()
    assert "<script" not in page                     # nothing runs, nothing loads
    assert not re.search(r'(src|href)="(https?:)?//|url\((https?:)?//', page)
    assert page.count("<svg") == 2 and f'id="change-{change.id}"' in page
    feed = ET.parse(tmp_path / "dash" / "feed.atom").getroot()
    entries = feed.findall("{http://www.w3.org/2005/Atom}entry")
    assert len(entries) == len([c for c in again.changes if c.confirmed])
    assert {p.name for p in out} == {"index.html", "feed.atom", "summary.txt", "track.json"}
    shot = ROOT / "build" / "screenshots" / "track.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                           "--no-first-run", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync",
                           "--enable-logging=stderr",
                           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1100,1400",
                           f"--screenshot={shot}", (tmp_path / "dash" / "index.html").as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert "CONSOLE" not in proc.stderr, proc.stderr[-500:]
    assert shot.stat().st_size > 20_000


@pytest.mark.parametrize("text, profile, wanted", [
    (SUITE.replace('path = "p.toml"', 'path = "missing.toml"'), PROFILE, "missing.toml"),
    (SUITE.replace('kernels = ["local:a", "local:b", "local:c", "local:d", "local:e"]',
                   'kernels = "debian:9.9.."'), PROFILE, "kernels"),
    (SUITE.replace('metrics = ["advise_ns_per_page", "cycle_ns_per_page"]',
                   'metrics = ["ops_per_s_real"]'), PROFILE, "none of the suite's metrics"),
    (SUITE.replace('reference = "local:a"', 'reference = "local:z"'), PROFILE, "reference"),
    (SUITE + "colour = 1\n", PROFILE, "colour"),
])
def test_bad_suites_are_one_line_before_anything_is_measured(tmp_path, text, profile, wanted):
    path = write_suite(tmp_path, text, profile)
    with pytest.raises(MmlabError, match=wanted):
        suite.load(path)
    proc = mmlab("track", "run", str(path), "--no-refresh", "--results", str(tmp_path / "r"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "r").exists()


def test_a_store_of_another_suite_is_refused(tmp_path):
    found = suite.load(write_suite(tmp_path))
    store = Store(tmp_path / "r")
    pool, _ = fake_pool()
    session.run(store, found, pool, refresh=False, say=lambda m: None, version=version)
    other = suite.load(write_suite(tmp_path, SUITE.replace('name = "fake"', 'name = "other"')))
    with pytest.raises(MmlabError, match="holds cells of suite 'fake'"):
        session.run(store, other, pool, refresh=False, say=lambda m: None, version=version)


def test_change_points_meet_their_targets_in_simulation():
    """20-release series, a fixed seed: false candidates and changes in A/A
    series, a 10% step in time at 5% noise, a 2% step in counts."""
    rates = simulate.run(series=300, seed=1)
    assert simulate.Targets().missed(rates) == []
    by = {r.case.name: r for r in rates}
    assert by["A/A, times, 5% noise"].any_candidate <= 0.05
    assert by["A/A, times, 5% noise"].false_confirmed <= 0.01
    assert by["10% step in time, 5% noise"].found_all >= 0.90
    assert by["2% step in counts, 0.3% noise"].found_all >= 0.99


def test_the_shipped_suite_reads(monkeypatch):
    """experiments/suites/seeds.toml: its profiles and metrics, its open range."""
    from mmlab.kernels import specs
    monkeypatch.setattr(specs, "expand", lambda names, apt=None: [
        "debian:6.1", "debian:6.12", "debian:6.19", "debian:7.3"])
    found = suite.load(ROOT / "experiments" / "suites" / "seeds.toml")
    assert found.reference == "debian:6.12" and len(found.profiles) >= 5
