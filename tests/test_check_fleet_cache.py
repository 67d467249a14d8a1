"""A check's fleet over hosts that share its kernel cache: the cache's
identity (a token made once in its folder, the same for two makers at
once), each worker's registration carrying it, and `mmlab check
--machines` accepting a worker on another host exactly when it reads this
process's cache, refusing one that reads another or has not said which in
one line before anything is built or made."""

from __future__ import annotations

import multiprocessing
import re
import socket
from pathlib import Path

import pytest

from mmlab.bench import services
from mmlab.errors import MmlabError
from mmlab.fleet import registry
from mmlab.machine import paths
from mmlab.store import Store

from .conftest import mmlab
from .test_check import patch_file
from .test_check_fleet import profiles


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """This process's kernel cache, private to the test (not made yet)."""
    where = tmp_path / "cache" / "kernels"
    monkeypatch.setenv("MMLAB_KERNEL_CACHE", str(where))
    return where


@pytest.fixture(scope="module")
def pg():
    with services.PostgresCluster() as cluster:
        yield cluster


def test_the_identity_is_made_once_and_read_back_the_same(cache):
    """Asked without making, a cache that has none says None and nothing is
    made; made, it is a token that every later read returns, readable by
    any user (an NFS server may map root to nobody), alone in the folder
    beside the kernels (no half-made file left)."""
    assert paths.kernel_cache_id(make=False) is None and not cache.exists()
    made = paths.kernel_cache_id()
    assert made is not None and re.fullmatch(r"[0-9a-f]{32}", made)
    assert paths.kernel_cache_id() == paths.kernel_cache_id(make=False) == made
    assert [p.name for p in cache.iterdir()] == [paths.CACHE_ID]
    assert (cache / paths.CACHE_ID).read_text() == made + "\n"
    assert (cache / paths.CACHE_ID).stat().st_mode & 0o777 == 0o644


def test_a_mangled_identity_is_refused_naming_its_file(cache):
    cache.mkdir(parents=True)
    (cache / paths.CACHE_ID).write_text("not a token\n")
    with pytest.raises(MmlabError, match=re.escape(
            f"{cache / paths.CACHE_ID}: not a kernel cache's identity (32 hex digits); "
            "remove it and mmlab makes another")):
        paths.kernel_cache_id()


def test_makers_at_once_agree_on_one_identity(cache, monkeypatch):
    """Four processes find no identity and each draws its own token only
    once all four have (the race at its widest): one token wins, and all
    four read it."""
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    draw = paths.secrets.token_hex
    monkeypatch.setattr(paths.secrets, "token_hex", lambda n: (barrier.wait(30), draw(n))[1])
    makers = [ctx.Process(target=lambda: out.put(paths.kernel_cache_id())) for _ in range(4)]
    for p in makers:
        p.start()
    said = [out.get(timeout=60) for _ in makers]
    for p in makers:
        p.join(timeout=60)
    assert all(p.exitcode == 0 for p in makers)
    assert len(set(said)) == 1 and said[0] == (cache / paths.CACHE_ID).read_text().strip()
    assert [p.name for p in cache.iterdir()] == [paths.CACHE_ID]


def test_a_worker_registers_the_kernel_cache_it_reads(cache, pg, monkeypatch):
    """`mmlab worker` (its broker faked, its store real) registers the
    identity and path of its kernel cache, made now."""
    from mmlab.fleet import engine, worker

    class Celery:
        def task(self, name):
            return lambda f: f

        def worker_main(self, argv):
            pass
    monkeypatch.setattr(engine, "app", lambda broker: Celery())
    monkeypatch.setattr(engine, "reachable", lambda celery: None)
    monkeypatch.setattr(engine, "active", lambda celery: [])
    monkeypatch.setattr(engine, "on_process_exit", lambda f: None)
    url = pg.url("registers")
    worker.serve("w", url, "redis://nowhere")
    said = registry.machines(Store(url))["w"].kernel_cache
    assert said == {"id": paths.kernel_cache_id(make=False), "path": str(cache)}
    assert said["id"] is not None


def register(url: str, name: str, host: str, cache: dict | None) -> None:
    """A machine's registration as its worker on `host` would make it; an
    older mmlab's (no kernel cache said) when `cache` is None."""
    probe = {"cpus": 2, "cpu_model": "a CPU", "memory": "8 GiB", "numa_nodes": 1,
             "kernel": "6.12", "accelerator": "tcg",
             **({"kernel_cache": cache} if cache is not None else {})}
    registry.register(Store(url), name, f"{name}@{host}", "redis://broker", probe)


def test_a_worker_elsewhere_that_reads_this_cache_is_accepted(cache, pg):
    """A worker on another host that registered this cache's identity (the
    folder shared, at another path there), and a worker here that said
    nothing of its cache (as before), both spread a check's experiments."""
    from mmlab.cli.check import _fleet
    url = pg.url("accepted")
    register(url, "far", "elsewhere", {"id": paths.kernel_cache_id(),
                                       "path": "/mnt/lab/kernels"})
    register(url, "near", socket.gethostname(), None)
    store, fleet = _fleet(url, ["far", "near"], lambda event: None)
    assert fleet.machines == ["far", "near"]
    store.close()


def tree(where: Path) -> Path:
    """A kernel tree the check reads, whose build would fail."""
    (where / "mm").mkdir(parents=True)
    (where / "Makefile").write_text("all:\n")
    (where / "Kconfig").write_text("")
    (where / "mm/vmscan.c").write_text("\n" * 9 + "static int shrink(void)\n{\n\treturn 1;\n}\n")
    return where


@pytest.mark.parametrize("theirs, said", [
    ({"id": "f" * 32, "path": "/srv/kernels"}, "reads the kernel cache /srv/kernels on elsewhere"),
    (None, "has not said which kernel cache it reads (an older mmlab's worker: start it "
           "again)"),
])
def test_a_worker_elsewhere_on_another_cache_is_refused_before_anything(cache, pg, tmp_path,
                                                                        theirs, said):
    """Another cache's identity, or none said: one line naming the machine,
    its host and the fix, exit status 2, and nothing built, stored or made
    in this process's caches (not even the cache's identity)."""
    url = pg.url("refused_other" if theirs else "refused_unsaid")
    register(url, "far", "elsewhere", theirs)
    given = [a for p in profiles(tmp_path) for a in ("--profile", str(p))]
    done = mmlab("check", str(patch_file(tmp_path, 1, 1, "mm: one")), "--base",
                 str(tree(tmp_path / "tree")), *given, "--machines", "far", "--results", url)
    assert done.returncode == 2 and not cache.parent.exists()
    assert done.stderr.strip().splitlines() == [
        f"mmlab: --machines far: its worker (far@elsewhere) is not on this machine and {said}, "
        f"not this check's ({cache}), where the kernels it builds go: start both with "
        "MMLAB_KERNEL_CACHE naming one folder they share (an NFS mount), or the worker here "
        f"(as far@{socket.gethostname()})"]
    assert [r["id"] for r in Store(url).experiments()] == []
