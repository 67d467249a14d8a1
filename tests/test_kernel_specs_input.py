"""Kernel names on the command line and in profiles: `narrow --kernels`
put in order by version (or refused when it cannot be), and a kernel that
cannot be had refused in one line before a store, a cache or a fetch is
made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mmlab.errors import MmlabError
from mmlab.kernels import catalog, images
from mmlab.run import narrow
from mmlab.targets import TargetPool
from tests.conftest import mmlab
from tests.fake_target import FakeTarget
from tests.test_narrow import FAKE_CATALOG

PROFILE = """
name = "narrowed"
workload = "pageout-refault"
repetitions = 5
metrics = ["advise_ns_per_page"]
baseline = { kernel = "host" }
[params]
mapping-kb = 1024
[matrix]
kernel = ["host"]
"""


@pytest.fixture
def kernels(tmp_path, monkeypatch):
    """A recorded catalog (no network, no apt) and a private kernel cache
    holding local and build kernels of known and unknown versions."""
    monkeypatch.setattr(catalog.Apt, "catalog", lambda self: FAKE_CATALOG)
    monkeypatch.setattr(catalog.Apt, "last_catalog", lambda self: FAKE_CATALOG)
    cache = tmp_path / "cache" / "kernels"
    monkeypatch.setenv("MMLAB_KERNEL_CACHE", str(cache))
    for name, release in (("local:rc", "6.15.0-rc2+"), ("local:old", "6.1.0"),
                          ("local:bare", "unknown"), ("build:a", "6.12.117"),
                          ("build:b", "6.12.117")):
        where = cache / name.replace(":", "-")
        where.mkdir(parents=True)
        (where / "kernel.json").write_text(json.dumps(
            {"name": name, "version": release, "source": "tree", "config_sha256": "",
             "dir": str(where)}))
    return cache


def test_kernels_given_newest_first_are_searched_oldest_first(kernels):
    said: list[str] = []
    assert narrow.ordered(["debian:7.3", "debian:6.12"], said.append) == [
        "debian:6.12", "debian:7.3"]
    assert said == ["narrow: kernels ordered oldest to newest by version: "
                    "debian:6.12 (6.12.117), debian:7.3 (7.3.4)"]
    said.clear()
    assert narrow.ordered(["debian:6.1", "local:rc", "debian:6.19", "debian:6.18"],
                          said.append) == ["debian:6.1", "local:rc", "debian:6.18", "debian:6.19"]
    assert "local:rc (6.15~rc2)" in said[0]
    said.clear()
    assert narrow.ordered(["local:old", "debian:6.12"], said.append) == [
        "local:old", "debian:6.12"]
    assert said == []                                # in order already: nothing to say


@pytest.mark.parametrize("names, why", [
    (["debian:6.12", "local:bare"], r"--kernels: cannot order local:bare oldest to newest: "
                                    "no kernel version"),
    (["build:a", "build:b"], "--kernels: cannot order build:a and build:b: both are version "
                             r"6\.12\.117"),
    (["debian:6.12.117", "build:b"], "cannot order .* both are version 6.12.117"),
    (["debian:6.12", "local:nonexistent"], "--kernels: unknown kernel 'local:nonexistent'"),
    (["debian:6.12", "build:deadbeef"], "--kernels: unknown kernel 'build:deadbeef' .*; build "
                                        "it with 'mmlab kernels build SOURCE --name deadbeef'"),
    (["debian:6.12"], "--kernels: narrow needs at least two kernels, got debian:6.12"),
])
def test_kernels_it_cannot_order_are_refused_in_one_line(kernels, names, why):
    with pytest.raises(MmlabError, match=why) as exc:
        narrow.ordered(names, print)
    assert "\n" not in str(exc.value)


def test_narrow_names_the_step_oldest_first_whatever_the_order_given(kernels, tmp_path,
                                                                        monkeypatch):
    """End to end, through the command, on a fake target where 7.3 is twice
    as fast: given newest first, the answer is still an improvement from
    6.12 to 7.3, not a regression from 7.3 to 6.12."""
    from mmlab.cli import app
    fake = FakeTarget(cv=0.01, model=lambda arm: (
        0.5 if arm.kernel == "debian:7.3" else 1.0, {}))
    monkeypatch.setattr(TargetPool, "local_target", lambda pool, arm: fake)
    (tmp_path / "p.toml").write_text(PROFILE)
    done = CliRunner().invoke(app, ["narrow", str(tmp_path / "p.toml"), "--kernels",
                                    "debian:7.3,debian:6.12", "--results", str(tmp_path / "r")])
    assert done.exit_code == 0, done.output
    assert "advise_ns_per_page: improvement introduced between debian:6.12 and debian:7.3" \
        in done.output
    assert "ordered oldest to newest by version: debian:6.12 (6.12.117), debian:7.3" \
        in done.output


def refused(tmp_path: Path, *args: str) -> str:
    """Run mmlab with a private state dir, kernel cache and results dir;
    expect one line and a non-zero exit, and nothing made."""
    results, cache, state = tmp_path / "r", tmp_path / "cache" / "kernels", tmp_path / "state"
    state.mkdir()
    proc = mmlab(*args, "--results", str(results),
                 env={"MMLAB_STATE_DIR": str(state), "MMLAB_KERNEL_CACHE": str(cache)})
    assert proc.returncode != 0, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert not results.exists(), "a store was made before the refusal"
    assert not cache.parent.exists(), "a cache was made before the refusal"
    return proc.stderr


def test_narrow_over_one_kernel_makes_no_store(tmp_path):
    (tmp_path / "p.toml").write_text(PROFILE)
    err = refused(tmp_path, "narrow", str(tmp_path / "p.toml"), "--kernels", "debian:6.12")
    assert "--kernels: narrow needs at least two kernels, got debian:6.12" in err


def test_narrow_over_an_unknown_local_kernel_makes_no_store(tmp_path):
    (tmp_path / "p.toml").write_text(PROFILE)
    err = refused(tmp_path, "narrow", str(tmp_path / "p.toml"), "--kernels",
                  "local:nonexistent,local:other")
    assert "--kernels: unknown kernel 'local:nonexistent'" in err


@pytest.mark.parametrize("kernel", ["local:nonexistent", "build:deadbeef"])
def test_a_run_on_a_kernel_nothing_can_fetch_makes_no_store(tmp_path, kernel):
    """Said once, as the refusal, not as a warning before the run and again
    as each trial fails."""
    err = refused(tmp_path, "run", "pageout-refault", "--kernel", kernel, "--samples", "2")
    assert f"unknown kernel '{kernel}'" in err and "warning" not in err


def test_a_bare_metal_run_on_a_kernel_nothing_can_fetch_makes_no_store(tmp_path, monkeypatch):
    """Nothing kexecs a kernel no cache holds: refused before the machine's
    base kernel is fetched or a store made."""
    monkeypatch.setenv("MMLAB_BARE_METAL", "simulated:debian:6.12")
    err = refused(tmp_path, "run", "pageout-refault", "--bare-metal", "--kernel",
                  "local:nonexistent", "--samples", "1")
    assert "unknown kernel 'local:nonexistent'" in err


def test_a_profile_on_a_kernel_nothing_can_fetch_makes_no_store(tmp_path):
    (tmp_path / "p.toml").write_text(PROFILE.replace('"host"', '"local:nonexistent"'))
    err = refused(tmp_path, "experiment", "run", str(tmp_path / "p.toml"))
    assert "unknown kernel 'local:nonexistent'" in err


def test_a_debian_kernel_that_cannot_be_fetched_is_said_once(monkeypatch):
    """A Debian kernel may be fetched later; a fetch that fails now is said
    once, however many times the plan is checked (the driver, then the
    runner), and its trials fail with the reason."""
    from mmlab.experiment.plan import parse
    from mmlab.targets.qemu import QemuTarget
    monkeypatch.setattr(images, "ready", lambda name, say: MmlabError("no network"))
    said: list[str] = []
    target = QemuTarget("debian:6.12", said.append)
    plan = parse(PROFILE)
    target.check(plan)
    target.check(plan)
    assert said == ["qemu:debian:6.12: no network; its trials will fail"]
