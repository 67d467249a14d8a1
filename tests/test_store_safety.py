"""The store where its disk or directory says no: a disk that fills during a
run is one line naming that disk, with the trials committed before it kept;
a store that could not be made leaves nothing behind; and a store in a
directory nobody may write is still read by the commands that only read."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mmlab.errors import MmlabError
from mmlab.experiment.plan import parse
from mmlab.run import runner
from mmlab.store import Store

from .conftest import mmlab
from .fake_target import FakeTarget, fake_pool
from .test_bad_input import one_line, read_only

PROFILE = """
name = "store-safety"
workload = "pageout-refault"
repetitions = 40
samples_per_trial = 5
metrics = ["cycle_ns_per_page"]
baseline = "A"
seed = 7
[params]
mapping-kb = 1024
[[arms]]
name = "A"
[[arms]]
name = "B"
"""

SOURCE = "mmlab-test-disk"          # the tmpfs's source, as the message names the disk


@contextmanager
def small_disk(where: Path, size_kb: int) -> Iterator[Path]:
    """A tmpfs of `size_kb` mounted at `where` for the block: a disk that
    really fills, with the kernel's own ENOSPC."""
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k,mode=0755", SOURCE,
                    str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "--lazy", str(where)], check=True)  # open files too


def fill(disk: Path) -> Path:
    """Write a file until the disk has no block left; return it."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


class TwoAtOnce(FakeTarget):
    """Trials two at a time, on worker threads, committed as they end."""

    def side_by_side(self, plan):
        return 2


@pytest.mark.parametrize("target", [FakeTarget, TwoAtOnce])
def test_a_disk_that_fills_during_a_run_says_which_and_keeps_the_finished_trials(tmp_path,
                                                                                 target):
    """The commit that finds the disk full ends the run (it is no failed
    trial: the next would find the disk as full)."""
    plan = parse(PROFILE, "store-safety.toml")
    with small_disk(tmp_path / "disk", 1024) as disk:
        store = Store(disk / "lab")
        exp_id = store.create_experiment(plan)
        filler = fill(disk)
        os.truncate(filler, filler.stat().st_size - 96 * 1024)   # room for a few trials
        with pytest.raises(MmlabError) as raised:
            runner.run(store, exp_id, plan, fake_pool(target()))
        said = str(raised.value)
        assert "the disk holding the store is full" in said and SOURCE in said, said
        assert str(disk) in said and "\n" not in said
        store.close()
        filler.unlink()
        again = Store(disk / "lab")
        trials = again.trials(exp_id)
        done = [t for t in trials if t.status == "done"]
        assert 0 < len(done) < len(trials) and all(t.status != "failed" for t in trials)
        kept = again.samples_by_arm(exp_id)
        assert sum(len(s) for s in kept.values()) == len(done) * plan.profile.samples_per_trial
        again.close()


def test_a_store_that_cannot_be_made_on_a_full_disk_leaves_nothing(tmp_path):
    with small_disk(tmp_path / "disk", 256) as disk:
        fill(disk)
        proc = mmlab("run", "pageout-refault", "--samples", "1",
                     "--results", str(disk / "new" / "lab"))
        one_line(proc, "the disk holding the store is full", SOURCE)
        assert os.listdir(disk) == ["filler"]


def test_a_store_in_a_read_only_directory_is_read_but_not_written(tmp_path):
    lab = tmp_path / "lab"
    plan = parse(PROFILE.replace("repetitions = 40", "repetitions = 3"), "store-safety.toml")
    store = Store(lab)
    runner.run(store, store.create_experiment(plan), plan, fake_pool(FakeTarget()))
    store.close()
    before = sorted(os.listdir(lab))
    with read_only(lab):
        listed = mmlab("experiments", "--results", str(lab))
        assert listed.returncode == 0 and "store-safety" in listed.stdout, listed.stderr
        for command in (["show", "1"], ["compare", "1", "--json"], ["report", "1"],
                        ["bundle", "1", str(tmp_path / "evidence")]):
            proc = mmlab(*command, "--results", str(lab))
            assert proc.returncode == 0, (command, proc.stderr)
        one_line(mmlab("run", "pageout-refault", "--samples", "1", "--results", str(lab)),
                 str(lab), "read-only directory", "mmlab cannot write its store there")
        assert sorted(os.listdir(lab)) == before


def test_reading_an_older_store_migrates_it_where_it_can_be_written(tmp_path):
    """A store from before trials kept their place in the round: the
    commands that only read open it for writing once, to add the column."""
    plan = parse(PROFILE.replace("repetitions = 40", "repetitions = 3"), "store-safety.toml")
    store = Store(tmp_path / "lab")
    exp_id = store.create_experiment(plan)
    runner.run(store, exp_id, plan, fake_pool(FakeTarget()))
    slots = [t.slot for t in store.trials(exp_id)]
    store.db.execute("ALTER TABLE trials DROP COLUMN slot")
    store.close()
    again = Store(tmp_path / "lab", create=False, read_only=True)
    assert [t.slot for t in again.trials(exp_id)] == slots and not again.db.read_only
    again.close()
    reader = Store(tmp_path / "lab", create=False, read_only=True)
    assert reader.db.read_only and [t.slot for t in reader.trials(exp_id)] == slots
    reader.close()
