"""The CPU clock axes (governor, turbo): read, applied through the journal
with consent and put back after the trial or a crash, refused in one line
where the machine cannot set them.  Every test points cpufreq at a fake
sysfs tree, so no CPU's clock is touched."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mmlab import cli
from mmlab.census import recipe
from mmlab.errors import MmlabError
from mmlab.experiment.plan import parse
from mmlab.machine import cpufreq, knobs
from mmlab.targets import probe, qemu
from mmlab.targets.host import HostTarget
from mmlab.workloads import mmwork

from .conftest import THP_PAIR
from .test_bad_input import WAITED

CLOCK = THP_PAIR.replace('thp = ["hugepage", "nohugepage"]',
                         'thp = ["hugepage", "nohugepage"]\ngovernor = ["performance"]\n'
                         'turbo = ["off"]')
INTEL, BOOST = "intel_pstate/no_turbo", "cpufreq/boost"


@pytest.fixture(autouse=True)
def own_lock(tmp_path, monkeypatch):
    """Sessions take a lock of their own, not this machine's."""
    monkeypatch.setenv("MMLAB_LOCK", str(tmp_path / "machine.lock"))


def fake_cpus(root: Path, governors: tuple[str, ...] = ("performance", "powersave"),
              switch: str | None = INTEL) -> Path:
    """cpu0 and cpu1 online under `governors`' last, cpu2 offline; turbo on."""
    for n in range(3):
        freq = root / f"cpu{n}/cpufreq"
        freq.mkdir(parents=True)
        (freq / "scaling_governor").write_text(governors[-1] + "\n")
        (freq / "scaling_available_governors").write_text(" ".join(governors) + "\n")
    (root / "cpu1/online").write_text("1\n")
    (root / "cpu2/online").write_text("0\n")
    if switch:
        (root / switch).parent.mkdir(exist_ok=True)
        (root / switch).write_text("0\n" if switch == INTEL else "1\n")
    return root


@pytest.fixture
def cpu(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(cpufreq, "CPU", fake_cpus(tmp_path / "cpu"))
    return tmp_path / "cpu"


def governors(root: Path) -> list[str]:
    return [(root / f"cpu{n}/cpufreq/scaling_governor").read_text().strip() for n in range(3)]


@pytest.mark.parametrize("switch, off", [(INTEL, "1"), (BOOST, "0")])
def test_each_tunable_reads_applies_and_restores(tmp_path, monkeypatch, switch, off):
    root = fake_cpus(tmp_path / "cpu", switch=switch)
    monkeypatch.setattr(cpufreq, "CPU", root)
    assert (cpufreq.Governor().read(), cpufreq.Turbo().read()) == ("powersave", "on")
    journal = knobs.Journal(tmp_path / "journal.json")
    with journal.session():
        changes = knobs.apply(knobs.HostSettings(governor="performance", turbo="off"), journal,
                              allowed=True)
        assert len(changes) == 3                      # two online CPUs and the switch
        assert governors(root) == ["performance", "performance", "powersave"]  # cpu2 offline
        assert (root / switch).read_text() == off
        env = probe.environment()
        assert (env["governor"], env["turbo"]) == ("performance", "off")
    assert governors(root) == ["powersave"] * 3
    assert (root / switch).read_text().strip() != off
    assert cpufreq.Turbo().read() == "on" and not journal.path.exists()


def test_a_crashed_runs_clock_is_put_back_by_the_next_mmlab(cpu, tmp_path, monkeypatch):
    monkeypatch.setenv("MMLAB_STATE_DIR", str(tmp_path / "state"))
    crash = ("import os, pathlib\n"
             "from mmlab.machine import cpufreq, knobs\n"
             f"cpufreq.CPU = pathlib.Path({str(cpu)!r})\n"
             "knobs.apply(knobs.HostSettings(governor='performance', turbo='off'),\n"
             "            knobs.Journal(), allowed=True)\n"
             "os._exit(9)\n")
    died = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True)
    assert died.returncode == 9, died.stderr
    assert governors(cpu)[:2] == ["performance"] * 2 and cpufreq.Turbo().read() == "off"
    # The next mmlab reads the same fake CPU folder: only its clock files
    # are settings a journal may put back.
    restore = ("import pathlib\nfrom mmlab.machine import cpufreq\n"
               f"cpufreq.CPU = pathlib.Path({str(cpu)!r})\nfrom mmlab.cli import main\nmain()\n")
    restored = subprocess.run([sys.executable, "-c", restore, "restore"], capture_output=True,
                              text=True)
    assert "an earlier run did not finish; restored:" in restored.stderr, restored.stderr
    assert str(cpu / "cpu1/cpufreq/scaling_governor") in restored.stderr
    assert governors(cpu) == ["powersave"] * 3 and cpufreq.Turbo().read() == "on"


def test_a_host_trial_runs_at_its_arms_clock_and_puts_it_back(cpu, monkeypatch):
    seen = []
    monkeypatch.setattr(mmwork, "sample", lambda *a, **k: seen.append(
        (cpufreq.Governor().read(), cpufreq.Turbo().read())) or [])
    plan = parse(CLOCK.replace("repetitions = 6", "repetitions = 6\nhost_changes = true"))
    target = HostTarget()
    target.check(plan)
    result = target.run_trial(plan.arms[0], plan)
    assert seen == [("performance", "off")]
    assert (result.environment["governor"], result.environment["turbo"]) == ("performance", "off")
    assert governors(cpu) == ["powersave"] * 3 and cpufreq.Turbo().read() == "on"


def test_a_guest_arm_sets_the_hosts_clock_for_its_trial(cpu, monkeypatch):
    """A KVM guest's vCPUs run at the host's clock, which it cannot set."""
    seen = []
    monkeypatch.setattr(qemu, "accelerator", lambda kernel, cache: ("kvm", "test"))
    monkeypatch.setattr(qemu, "guest_environment", lambda *a: {"target": "qemu"})
    monkeypatch.setattr(qemu, "sample", lambda *a, **k: seen.append(
        cpufreq.Governor().read()) or [])
    plan = parse(CLOCK.replace("[params]", 'kernel = "local:fake"\n[params]'))
    refused = qemu.QemuTarget("local:fake", say=lambda _: None)
    with pytest.raises(MmlabError, match=r"arm .* would change .*/cpu0/cpufreq/scaling_governor:"
                                         r" powersave -> performance; set host_changes"):
        refused.check(plan)
    target = qemu.QemuTarget("local:fake", say=lambda _: None, allow_changes=True)
    monkeypatch.setattr(target, "kernel", lambda: SimpleNamespace(name="local:fake"))
    result = target.run_trial(plan.arms[0], plan)
    assert seen == ["performance"] and result.environment["governor"] == "performance"
    assert governors(cpu) == ["powersave"] * 3 and cpufreq.Turbo().read() == "on"


def test_changes_are_refused_without_consent(cpu, tmp_path):
    with pytest.raises(MmlabError, match=r"would change .*cpu0/cpufreq/scaling_governor: "
                                         r"powersave -> performance; set host_changes"):
        knobs.apply(knobs.HostSettings(governor="performance"),
                    knobs.Journal(tmp_path / "j.json"), allowed=False)
    with pytest.raises(MmlabError, match=r"arm thp=hugepage,governor=performance,turbo=off "
                                         r"would change"):
        HostTarget().check(parse(CLOCK))
    assert governors(cpu) == ["powersave"] * 3 and cpufreq.Turbo().read() == "on"
    assert not (tmp_path / "j.json").exists()
    assert knobs.apply(knobs.HostSettings(governor="powersave", turbo="on"),
                       knobs.Journal(tmp_path / "j.json"), allowed=False) == []


def test_a_governor_a_cpu_does_not_offer_is_refused_consent_or_not(tmp_path, monkeypatch):
    root = fake_cpus(tmp_path / "cpu")
    (root / "cpu0/cpufreq/scaling_available_governors").write_text("ondemand performance "
                                                                    "powersave\n")
    monkeypatch.setattr(cpufreq, "CPU", root)
    with pytest.raises(MmlabError, match="governor = 'ondemand': cpu1 offers performance, "
                                         "powersave"):
        knobs.apply(knobs.HostSettings(governor="ondemand"), knobs.Journal(tmp_path / "j.json"),
                    allowed=True)
    plan = parse(CLOCK.replace('"performance"', '"ondemand"'))
    with pytest.raises(MmlabError, match="arm thp=hugepage,governor=ondemand,turbo=off: "
                                         "governor = 'ondemand': cpu1"):
        HostTarget(allow_changes=True).check(plan)
    assert governors(root) == ["powersave"] * 3 and not (tmp_path / "j.json").exists()


def no_cpufreq(root: Path) -> Path:
    """As this project's VMs are: CPUs, an empty cpufreq folder, no driver."""
    for n in range(2):
        (root / f"cpu{n}").mkdir(parents=True)
    (root / "cpufreq").mkdir()
    return root


def test_without_cpufreq_each_axis_is_named_and_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(cpufreq, "CPU", no_cpufreq(tmp_path / "cpu"))
    assert (cpufreq.Governor().read(), cpufreq.Turbo().read()) == ("none", "none")
    for key, settings in (("governor", knobs.HostSettings(governor="performance")),
                          ("turbo", knobs.HostSettings(turbo="off"))):
        with pytest.raises(MmlabError, match=f"{key} = .*no CPU frequency driver"):
            settings.clock_files()


@pytest.mark.parametrize("where", ["", 'kernel = "local:fake"\n'])
def test_a_run_without_cpufreq_is_one_line_and_no_store(tmp_path, monkeypatch, capsys, where):
    """On the host or for a guest arm, before any store, even with consent."""
    monkeypatch.setattr(cpufreq, "CPU", no_cpufreq(tmp_path / "cpu"))
    monkeypatch.setattr(signal, "signal", lambda *a: None)     # main's handlers stay main's
    path = tmp_path / "p.toml"
    path.write_text(CLOCK.replace("[params]", f"{where}[params]"))
    results = tmp_path / "r"
    monkeypatch.setattr(sys, "argv", ["mmlab", "experiment", "run", str(path), "--results",
                                      str(results), "--allow-host-changes"])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    lines = [ln for ln in capsys.readouterr().err.splitlines() if WAITED not in ln]
    assert exited.value.code == 2 and len(lines) == 1, lines
    assert "governor = 'performance': this machine has no CPU frequency driver" in lines[0]
    assert not results.exists()


def test_bad_values_and_census_guests_are_refused_by_name(tmp_path):
    with pytest.raises(MmlabError, match="matrix.turbo: 'fast'"):
        parse(CLOCK.replace('turbo = ["off"]', 'turbo = ["fast"]'))
    with pytest.raises(MmlabError, match="matrix.governor: 'Perf ormance'.*governor's name"):
        parse(CLOCK.replace('"performance"', '"Perf ormance"'))
    census = recipe.Recipe(description="x", command=["true"],
                           settings=knobs.HostSettings(turbo="off"))
    with pytest.raises(MmlabError, match="cannot run in a guest: governor and turbo"):
        recipe.travels(tmp_path / "r.toml", census)


@pytest.mark.parametrize("governor, turbo, rc, said", [
    ("performance", "off", 0, ""),
    ("schedutil", None, 1, "mmlab: governor = 'schedutil': cpu0 offers performance powersave"),
    (None, "on", 0, ""),
])
def test_a_bare_metal_kernel_sets_the_clock_itself_or_fails_its_trial(tmp_path, governor,
                                                                      turbo, rc, said):
    """A bare-metal arm's clock is set by its kernel under test (a shell,
    no Python there): as the host would set it, refused in the same words."""
    root = fake_cpus(tmp_path / "cpu")
    script = "set -e\n" + "\n".join(cpufreq.script(governor, turbo, str(root)))
    ran = subprocess.run(["busybox", "sh", "-c", script], capture_output=True, text=True)
    assert (ran.returncode, ran.stderr.strip()) == (rc, said)
    if governor == "performance":
        assert governors(root)[:2] == ["performance", "performance"]
    assert (root / INTEL).read_text().strip() == {"off": "1", "on": "0"}.get(turbo or "", "0")
    bare = CLOCK.replace("[params]", "bare_metal = true\n[params]").replace(
        "[matrix]", '[matrix]\nkernel = ["local:a"]')
    assert {a.settings.governor for a in parse(bare).arms} == {"performance"}


def test_a_bare_metal_kernel_without_cpufreq_says_so(tmp_path):
    script = "set -e\n" + "\n".join(cpufreq.script("performance", None, str(tmp_path)))
    ran = subprocess.run(["busybox", "sh", "-c", script], capture_output=True, text=True)
    assert ran.returncode == 1 and ran.stderr.strip() == f"mmlab: {cpufreq.NO_CPUFREQ}"
