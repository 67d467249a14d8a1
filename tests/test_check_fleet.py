"""The patch check spread over a fleet's machines (`mmlab check --machines`),
as the tracker spreads its cells: every profile's first look at once, one
experiment per machine, then every confirmation; the bisection's steps
one at a time; the attribution here.  With a fake fleet (each batch run by
the fake target, as a fleet would), and with two real workers on this
machine (their trials on the fake target); a lab directory, a machine no
worker registered and a worker on another host refused before anything
is built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmlab.check import request as requests
from mmlab.check import session
from mmlab.errors import MmlabError
from mmlab.run import driver
from mmlab.store import Store
from mmlab.targets import TargetPool

from .conftest import mmlab
from .test_check import PROFILE, Counting, kernel, patch_file

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def a_tree(monkeypatch):
    """The base `tests/` passes for a kernel tree (a Makefile and a Kconfig)."""
    monkeypatch.setattr(requests, "check_base", lambda spec: None)


def profiles(where: Path) -> list[Path]:
    """Two profiles of the same workload: both change where the kernel does."""
    out = []
    for name in ("pageout", "pageout-again"):
        (where / f"{name}.toml").write_text(PROFILE.replace('"pageout"', f'"{name}"'))
        out.append(where / f"{name}.toml")
    return out


def test_first_looks_and_confirmations_go_to_the_machines_at_once(tmp_path):
    """Two profiles, a three-patch series changed by its second patch: the
    first looks on m1 and m2 at once, then the confirmations; each
    bisection step alone; the fleet's fake runs every trial, the fake here
    only the attribution."""
    from mmlab.track import spread
    files = [patch_file(tmp_path, n, 3, f"mm: patch number {n}") for n in (1, 2, 3)]
    asked = requests.read(files, str(ROOT / "tests"), None, profiles(tmp_path))
    store = Store(tmp_path / "r")
    away, here = Counting({"local:p2", "local:p3"}), Counting({"local:p2", "local:p3"})
    batches: list[list[tuple[int, str, str]]] = []

    def run(ids: list[int]) -> None:
        batches.append([(e, store.plan(e).machine, store.plan(e).profile.derived.split(";")[0])
                        for e in ids])
        driver.run_experiment(store, ids, driver.Here(TargetPool(make=lambda arm: away)))
    kernels = [kernel("local:base")] + [kernel(f"local:p{n}") for n in (1, 2, 3)]
    result = session.run(store, asked, kernels,
                         driver.Here(TargetPool(make=lambda arm: here, say=lambda m: None)),
                         str(tmp_path / "r"), fleet=spread.Fleet(store, ["m1", "m2"], run))
    firsts, confirmations, *steps = batches
    note = "check local:base..local:p3"
    assert [(m, d) for _, m, d in firsts] == [
        ("m1", f"{note} first pageout"), ("m2", f"{note} first pageout-again")]
    assert [(m, d) for _, m, d in confirmations] == [
        ("m1", f"{note} confirm pageout"), ("m2", f"{note} confirm pageout-again")]
    assert [[(m, d.split()[-2]) for _, m, d in b] for b in steps] == [[("m1", "narrow")]] * 4
    assert result.experiments == [e for b in batches for e, _, _ in b]
    assert sorted((f.change.profile, f.patch) for f in result.found) == [
        ("pageout", 2), ("pageout-again", 2)]
    assert away.trials and not here.trials and not away.attributed
    assert sorted(here.attributed) == ["local:base", "local:base", "local:p3", "local:p3"]


def faked_build(monkeypatch) -> tuple[list[str], Counting]:
    """`mmlab check` in this process builds nothing (a fake kernel per
    patch) and runs here on the fake; the specs it was asked to build,
    and the fake."""
    import mmlab.targets
    from mmlab.kernels import kbuild
    built: list[str] = []

    def build_series(spec, patches, *a, **k):
        built.append(spec)
        return [kernel("local:base"), *(kernel(f"local:p{n}") for n in range(1, len(patches) + 1))]
    monkeypatch.setattr(kbuild, "build_series", build_series)
    here = Counting({"local:p2"})
    monkeypatch.setattr(mmlab.targets, "TargetPool", lambda *a, **k: TargetPool(
        make=lambda arm: here, say=lambda m: None))
    return built, here


def check(tmp_path: Path, results: str, machines: str):
    """`mmlab check --machines` of a two-patch series over two profiles."""
    from typer.testing import CliRunner

    from mmlab.cli import app
    files = [str(patch_file(tmp_path, n, 2, f"mm: patch number {n}")) for n in (1, 2)]
    given = [a for p in profiles(tmp_path) for a in ("--profile", str(p))]
    return CliRunner().invoke(app, ["check", *files, "--base", str(ROOT / "tests"), *given,
                                    "--machines", machines, "--results", results, "--json"])


def test_a_lab_directory_is_refused_before_anything_is_built(tmp_path):
    """`mmlab check --machines` with a results directory, on a tree whose
    build would fail: one line, nothing built or stored."""
    tree = tmp_path / "tree"
    (tree / "mm").mkdir(parents=True)
    (tree / "Makefile").write_text("all:\n")
    (tree / "Kconfig").write_text("")
    (tree / "mm/vmscan.c").write_text("\n" * 9 + "static int shrink(void)\n{\n\treturn 1;\n}\n")
    given = [a for p in profiles(tmp_path) for a in ("--profile", str(p))]
    done = mmlab("check", str(patch_file(tmp_path, 1, 1, "mm: one")), "--base", str(tree),
                 *given, "--machines", "m1,m2", "--results", str(tmp_path / "r"))
    assert done.returncode == 2 and not (tmp_path / "r").exists()
    assert done.stderr.strip().splitlines() == [
        f"mmlab: --machines needs the fleet's shared store: --results postgresql://... "
        f"(not {tmp_path / 'r'})"]


def serve(name: str, url: str, broker: str) -> None:
    """A worker of this machine whose trials run on the fake target, its
    kernels changed from the series' second patch on."""
    from mmlab.fleet import worker
    worker.serve(name, url, broker, make_target=lambda allow, arm: Counting({"local:p2"}))


def start_worker(name: str, url: str, broker: str, tmp_path: Path) -> subprocess.Popen:
    env = {**os.environ, "MMLAB_STATE_DIR": str(tmp_path / f"state-{name}")}
    return subprocess.Popen([sys.executable, "-c", "from tests.test_check_fleet import serve; "
                             f"serve({name!r}, {url!r}, {broker!r})"],
                            cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                            stdout=open(tmp_path / f"{name}.log", "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def test_two_workers_here_run_a_checks_experiments(monkeypatch, tmp_path):
    """Two real workers on this machine (PostgreSQL and Redis of the
    test's own): the check's trials run there, its attribution here; a
    machine no worker registered, and one whose worker is on another
    host, refused before anything is built."""
    from mmlab.bench import fleet as fleet_bench
    from mmlab.bench import services
    from mmlab.fleet import registry
    built, here = faked_build(monkeypatch)
    with services.PostgresCluster() as pg, services.Redis() as redis:
        url = pg.url("check")
        workers = [start_worker(n, url, redis.url, tmp_path) for n in ("a", "b")]
        try:
            fleet_bench.wait_for(["a", "b"], url, redis.url, workers, timeout=120)
            unknown = check(tmp_path, url, "a,nosuch")
            assert "machine nosuch: no worker has registered" in str(unknown.exception)
            registry.register(Store(url), "far", "far@elsewhere", redis.url, {})
            far = check(tmp_path, url, "a,far")
            assert isinstance(far.exception, MmlabError) and not built
            assert str(far.exception).startswith(
                "--machines far: its worker (far@elsewhere) is not on this machine")
            done = check(tmp_path, url, "a,b")
            assert done.exit_code == 1, done.output
            store = Store(url)
            ran = {r["id"]: store.plan(r["id"]).machine for r in store.experiments()}
            trials = {e: {t.status for t in store.trials(e)} for e in ran}
        finally:
            fleet_bench.stop_workers(workers)
    record = json.loads(done.stdout)
    assert len(built) == 1 and not here.trials and len(here.attributed) == 4
    assert sorted(record["experiments"]) == sorted(ran)
    assert all(statuses == {"done"} for statuses in trials.values())
    assert [ran[e] for e in record["experiments"][:4]] == ["a", "b", "a", "b"]
    assert sorted((c["profile"], c["patch"]) for c in record["changes"]) == [
        ("pageout", 2), ("pageout-again", 2)]
