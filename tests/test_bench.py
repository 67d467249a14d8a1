"""`make bench`'s verdict parts with tiny parameters: the noisy neighbour burns
and rests in turn and is always stopped, and the real A/A and THP profiles
run under it and are judged (the lead runs the full measurement)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmlab import bench

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(repetitions=3, max_repetitions=3, min_sample_ms=20)


def burners() -> list[int]:
    """PIDs of running noisy neighbours (by their program text)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if b"parent, period = os.getppid()" in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for_phase(period: float, on: bool) -> None:
    """Sleep to the start of the neighbour's next on (or off) phase."""
    now = time.monotonic()
    k = int(now / period) + 1                    # the next phase; odd phases burn
    if (k % 2 == 1) != on:
        k += 1
    time.sleep(k * period - now + 0.05)


def test_the_neighbour_burns_and_rests_and_is_always_stopped():
    before = set(burners())
    with pytest.raises(RuntimeError):
        with bench.NoisyNeighbour(period_s=0.6) as n:
            pid = n.proc.pid
            wait_for_phase(0.6, on=True)
            c0 = cpu_seconds(pid)
            time.sleep(0.4)
            burned = cpu_seconds(pid) - c0
            wait_for_phase(0.6, on=False)
            c0 = cpu_seconds(pid)
            time.sleep(0.4)
            rested = cpu_seconds(pid) - c0
            raise RuntimeError("the block fails")
    # It burns (a share of a core, as much as the machine's load leaves it:
    # 0.09 s of 0.4 s beside a load of 9 on 2 cores) and then rests.
    assert burned > 0.03 and rested < burned / 2, (burned, rested)
    assert set(burners()) == before and not Path(f"/proc/{pid}").exists()


def test_real_verdicts_run_under_the_neighbour(tmp_path, capsys):
    profiles = [ROOT / p for p in bench.REAL_PROFILES]
    found = bench.real_verdicts(profiles, tmp_path / "r", period_s=0.5, **TINY)
    assert [r.name for r in found] == ["aa-pageout", "pageout-thp-modes"]
    for r in found:
        assert r.result.rounds == 3 and r.result.done == 3 * len(r.plan.arms)
        assert r.plan.profile.min_sample_ms == 20
        assert r.judgement.comparisons and all(c.rounds == 3 for c in r.judgement.comparisons)
        assert r.plan.text.startswith(f"# {r.name}.toml as `make bench` ran it")
    lines = [line for r in found for line in r.expected()]
    assert lines[0].startswith("aa-pageout: B vs A: expected no change, got ")
    assert lines[1].startswith("pageout-thp-modes: thp=hugepage vs thp=nohugepage: expected "
                               "regression, got ")
    bench.print_real(found)
    assert "under a noisy neighbour" in capsys.readouterr().out
    assert burners() == []


def test_ctrl_c_stops_the_bench_and_its_neighbour(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "mmlab.bench", "--part", "verdicts",
                             "--repetitions", "3", "--max-repetitions", "3", "--min-sample-ms", "300",
                             "--period", "0.5", "--results", str(tmp_path / "r")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 60
        while not burners() and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.05)
        assert burners(), "the neighbour never started"
        time.sleep(1.0)                            # a trial is in flight
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted" in err
    assert burners() == []
