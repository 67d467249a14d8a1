"""Bad input, as a new user types it: one line on stderr naming the key,
value or file, a non-zero exit, and nothing started, built, downloaded or
created first."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .conftest import THP_PAIR, mmlab

ROOT = Path(__file__).resolve().parents[1]
PROFILE = THP_PAIR
EXEC = """
name = "bad-exec"
workload = "exec"
command = "echo 'x"
repetitions = 3
metrics = ["outside_wall_s"]
baseline = "A"
[[arms]]
name = "A"
"""


def one_line(proc: subprocess.CompletedProcess, *wanted: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode not in (0, None) and len(lines) == 1, proc.stderr
    for w in wanted:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def profile(tmp_path: Path, text: str, name: str = "p.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("line, wanted", [
    ("max_cv = inf", ["max_cv", "finite"]),
    ("timeout_s = inf", ["timeout_s", "finite"]),
    ("tolerance = nan", ["tolerance"]),
    ("budget_s = inf", ["budget_s", "finite"]),
])
def test_values_that_cannot_be_stored_are_refused_when_read(tmp_path, line, wanted):
    path = profile(tmp_path, line + "\n" + PROFILE)
    one_line(mmlab("experiment", "plan", path), *wanted)
    one_line(mmlab("experiment", "run", path, "--results", str(tmp_path / "r")), *wanted)
    assert not (tmp_path / "r").exists()


def test_files_that_are_not_profiles_are_named(tmp_path):
    latin = tmp_path / "latin.toml"
    latin.write_bytes((PROFILE + "# caf\xe9\n").encode("latin-1"))
    one_line(mmlab("experiment", "plan", str(latin)), str(latin), "not UTF-8")
    one_line(mmlab("experiment", "run", "/bin/true"), "/bin/true", "not UTF-8")
    one_line(mmlab("experiment", "plan", str(tmp_path)), "not a regular file")
    one_line(mmlab("experiment", "plan", str(tmp_path / "missing.toml")), "no such profile")
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    one_line(mmlab("experiment", "plan", str(fifo), timeout=30), "not a regular file")


def test_exec_commands_and_sources_that_cannot_be_read(tmp_path):
    one_line(mmlab("experiment", "plan", profile(tmp_path, EXEC)), "command",
             "No closing quotation")
    src = tmp_path / "repro.c"
    src.write_bytes(b"int main(void) { return 0; } /* \xe9 */\n")
    one_line(mmlab("run", "exec", "--source", str(src), "--results", str(tmp_path / "r")),
             "not UTF-8")
    one_line(mmlab("run", "exec", "--source", str(tmp_path / "none.c")), "none.c", "no such")
    assert not (tmp_path / "r").exists()


def test_stores_are_never_created_by_mistake(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line(mmlab("compare", "1", "--results", "mysql://x"), "mysql://x", "postgresql://")
    one_line(mmlab("compare", "1", "--results", ""), "--results ''")
    one_line(mmlab("experiments", "--results", "typo"), "typo", "no mmlab store")
    one_line(mmlab("show", "1", "--results", "typo"), "no mmlab store")
    one_line(mmlab("store", "copy", str(tmp_path / "missing"), str(tmp_path / "d")),
             "missing", "no mmlab store")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    ok = mmlab("run", "pageout-refault", "--samples", "1", "--mapping-kb", "1024",
               "--rounds", "1", "--min-ms", "0", "--results", "lab")
    assert ok.returncode == 0, ok.stderr
    one_line(mmlab("store", "copy", "lab", str(tmp_path / "lab")), "same store")


def test_options_a_target_cannot_honour_are_refused(tmp_path):
    for option, value in (("--numa-nodes", "2"), ("--vcpus", "2"), ("--memory-mb", "256"),
                          ("--trace-count", "folio_alloc_swap"), ("--functions", "5")):
        one_line(mmlab("run", "pageout-refault", option, value), option, "--kernel")
    one_line(mmlab("run", "pageout-refault", "--kernel", "debian:6.12", "--numa-nodes", "99"),
             "--numa-nodes")
    cpus = profile(tmp_path, PROFILE.replace('thp = ["hugepage", "nohugepage"]',
                                             'thp = ["hugepage", "nohugepage"]\n'
                                             'cpus = ["4096-4097"]'))
    one_line(mmlab("experiment", "run", cpus, "--results", str(tmp_path / "r")),
             "CPU 4096 is not available")
    numa = profile(tmp_path, PROFILE.replace("[params]", 'kernel = "debian:6.12"\n'
                                             "memory_mb = 200\n[params]")
                   .replace('thp = ["hugepage", "nohugepage"]',
                            'thp = ["hugepage", "nohugepage"]\nnuma_nodes = [4]'), "numa.toml")
    one_line(mmlab("experiment", "plan", numa), "numa_nodes", "4 NUMA nodes in 200 MiB")


def test_builds_and_searches_check_their_inputs_first(tmp_path):
    path = profile(tmp_path, PROFILE.replace("[params]", 'kernel = "debian:6.12"\n[params]'))
    one_line(mmlab("ab", path, "--patch", "/nonexistent.patch"), "/nonexistent.patch",
             "no such file")
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    one_line(mmlab("narrow", path, "--source", str(repo), "--commits", "A..B"),
             "not a kernel source tree")
    assert subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True,
                          text=True).stdout.count("\n") == 1


def test_commands_that_do_not_apply_say_so(tmp_path):
    results = str(tmp_path / "r")
    ok = mmlab("run", "pageout-refault", "--samples", "1", "--mapping-kb", "1024",
               "--rounds", "1", "--min-ms", "0", "--results", results)
    assert ok.returncode == 0, ok.stderr
    one_line(mmlab("fleet", "status", "--results", results), "has no fleet")
    one_line(mmlab("fleet", "summary", "1", "--results", results), "has no fleet")
    one_line(mmlab("compare", "1", "--json", "--csv", "--results", results), "choose one")
    one_line(mmlab("experiment", "run", profile(tmp_path, PROFILE), "--machines", "",
                   "--results", results), "--machines", "no machine named")
