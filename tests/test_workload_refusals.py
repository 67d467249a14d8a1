"""`mmlab run` refuses a workload setting it cannot honour in one line,
naming the option, before anything is created or run: a --dir that does
not exist, --insns on a host with nothing to count with."""

from __future__ import annotations

from pathlib import Path

from mmlab.workloads import insns

from .conftest import mmlab


def refused(tmp_path: Path, *args: str) -> str:
    """`mmlab run ARGS`'s one line, checked to be a refusal (exit 2) that
    created nothing: no results, no state, no lock."""
    env = {"MMLAB_STATE_DIR": str(tmp_path / "state"), "MMLAB_LOCK": str(tmp_path / "lock")}
    proc = mmlab("run", *args, "--results", str(tmp_path / "r"), env=env, timeout=300)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert sorted(p.name for p in tmp_path.iterdir()) == [], line
    return line


def test_a_missing_dir_is_refused_naming_it_and_not_made(tmp_path):
    missing = tmp_path / "no" / "such" / "dir"
    line = refused(tmp_path, "unmap-young", "--backing", "file", "--dir", str(missing),
                   "--samples", "1")
    assert f"--dir: '{missing}' is not an existing directory" in line
    assert not (tmp_path / "no").exists()


def test_insns_on_the_host_counts_with_perf_or_is_refused_saying_what_to_use(tmp_path):
    """Where this machine has a hardware instruction counter the command's
    instructions are counted; where it has none (this lab's host) the run is
    refused before it starts, saying why and that a guest counts them."""
    ok, why = insns.perf_status()
    if not ok:
        line = refused(tmp_path, "exec", "--insns", "--samples", "1", "--", "true")
        assert line.startswith("mmlab: --insns: no hardware instruction counter"), line
        assert "--kernel debian:" in line
        return
    env = {"MMLAB_STATE_DIR": str(tmp_path / "state"), "MMLAB_LOCK": str(tmp_path / "lock")}
    proc = mmlab("run", "exec", "--insns", "--samples", "1", "--json", "--results",
                 str(tmp_path / "r"), "--", "true", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "command_kernel_insns_per_run" in proc.stdout, why
