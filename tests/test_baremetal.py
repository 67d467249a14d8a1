"""Bare-metal trials by kexec.  Fast: the machine's shell functions and its
agent run here under busybox on a disk file and a pty (kexec a stand-in
that only records); the coordinator's conversation and the target run
against a machine a thread plays; bad input in the profile and the
environment.  Slow: a two-kernel experiment on a TCG guest standing in for
the machine, kexec'd into each kernel and back for every trial."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import pty
import re
import shutil
import socket
import subprocess
import threading
import time
import tty
from pathlib import Path

import pytest

from mmlab.errors import MmlabError
from mmlab.experiment import single
from mmlab.experiment.plan import parse
from mmlab.judge import measurements
from mmlab.kernels import images
from mmlab.report.terminal.experiment import accelerator_notes
from mmlab.run import driver
from mmlab.store import Store
from mmlab.targets import TargetPool, agentlink, baremetal, initramfs, kexec, simulated
from mmlab.workloads.mmwork import TrialFailed
from mmlab.workloads.samples import Sample

from .conftest import mmlab, run_profile
from .fake_target import RUSAGE

BUSYBOX = shutil.which("busybox")
needs_busybox = pytest.mark.skipif(BUSYBOX is None, reason="busybox is not installed "
                                   "(make setup installs busybox-static)")


def busybox(script: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([BUSYBOX or "busybox", "sh", "-c", script], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def here(tmp_path: Path, channel: Path | str) -> str:
    """machine.sh's functions with this test's disk, channel and kexec."""
    wiring = kexec.Wiring(channel=str(channel), disk="disk.img")
    (tmp_path / "machine.sh").write_text(kexec.machine_script(wiring))
    return ". ./machine.sh; DISK=disk.img KEXEC=./kexec\n"


@needs_busybox
def test_the_disk_gives_back_its_files_and_a_trials_results_once(tmp_path):
    big = os.urandom(kexec.MIB + 12345)
    kexec.disk(tmp_path / "disk.img", {"k1.vmlinuz": big, "base.append": b"console=ttyS0\n"},
               "test")
    (tmp_path / "res").write_text("frames\nMMLAB-DONE\n")
    out = busybox(here(tmp_path, "chan") + """
fetch k1.vmlinuz got && fetch base.append append && ! fetch k2.vmlinuz nothing
put_results n1 res; send_results; send_results
mark "MMLAB-PENDING n2"; send_results; send_results
fetch base.append again
""", tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "got").read_bytes() == big
    assert (tmp_path / "again").read_bytes() == b"console=ttyS0\n"   # results kept clear of it
    assert (tmp_path / "chan").read_text() == \
        "MMLAB-RESULTS n1 18\nframes\nMMLAB-DONE\nMMLAB-LOST n2\n"     # each said once


@needs_busybox
def test_results_too_big_for_the_disk_are_an_error_not_an_overwritten_library(tmp_path):
    kexec.disk(tmp_path / "disk.img", {"base.append": b"x\n"}, "test")
    with open(tmp_path / "res", "wb") as f:
        f.truncate(kexec.LIBRARY)
    out = busybox(here(tmp_path, "chan") + "put_results n1 res; send_results; "
                  "fetch base.append back", tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "chan").read_text() == \
        f"MMLAB-ERROR n1 results of {kexec.LIBRARY} bytes did not fit the disk\n"
    assert (tmp_path / "back").read_bytes() == b"x\n"


class PtyAgent:
    """kexec.AGENT run by busybox on a pty (its channel), a disk file and a
    kexec that records its arguments and the initrd it was given."""

    def __init__(self, tmp_path: Path, kexec_e_rc: int = 1):
        master, slave = pty.openpty()
        tty.setraw(slave)              # as /init's stty leaves ttyS1
        self.slave = slave
        self.dir = tmp_path
        (tmp_path / "kexec").write_text(
            "#!/bin/sh\necho \"$@\" >> kexec.args\n"
            "for a; do case $a in --initrd=*) cp \"${a#--initrd=}\" loaded.initrd;; esac; done\n"
            f"case $1 in -e) exit {kexec_e_rc};; esac\n")
        (tmp_path / "kexec").chmod(0o755)
        agent = kexec.AGENT.replace(". /mmlab/machine.sh\n", here(tmp_path, os.ttyname(slave)))
        (tmp_path / "agent.sh").write_text(agent)
        self.proc = subprocess.Popen([BUSYBOX or "busybox", "sh", "agent.sh"], cwd=tmp_path,
                                     stderr=subprocess.PIPE, text=True)
        self.link = agentlink.Link(os.fdopen(master, "r+b", buffering=0))

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.link.close()
        os.close(self.slave)


@needs_busybox
def test_the_agent_kexecs_the_kernel_with_the_trial_appended_and_reports_what_failed(tmp_path):
    hooks = initramfs.archive({"mmlab/kexec.sh": (0o644, b"# hooks\n")}, tmp_path / "c")
    prefix = hooks.read_bytes() + b"\0" * (-hooks.stat().st_size % 4)
    kexec.disk(tmp_path / "disk.img", {"k1.vmlinuz": b"a kernel", "k1.initrd": prefix},
               "test")
    agent = PtyAgent(tmp_path)
    try:
        deadline = time.monotonic() + 30
        assert agentlink.expect(agent.link, "MMLAB-AGENT-READY", deadline)
        with pytest.raises(TrialFailed, match="the agent on the machine: kexec -e into k1 "
                                              "returned"):
            agentlink.trial(agent.link, "k1", "console=ttyS0 quiet", "echo hi\n", deadline)
        args = (tmp_path / "kexec.args").read_text().splitlines()
        assert args[0].startswith("-l ") and args[0].endswith("--append=console=ttyS0 quiet "
                                                              f"mmlab.trial={args[0][-16:]}")
        assert args[1] == "-e"
        loaded = (tmp_path / "loaded.initrd").read_bytes()
        assert loaded.startswith(prefix)            # the kernel's parts, then the trial's
        assert gzip.decompress(loaded[len(prefix):]) == \
            gzip.decompress(initramfs.script_archive("echo hi\n"))
        assert agentlink.expect(agent.link, "MMLAB-AGENT-READY", deadline)  # back for more
        with pytest.raises(TrialFailed, match="k9 is not on the disk"):
            agentlink.trial(agent.link, "k9", "", "true\n", deadline)
        agent.link.send(b"MMLAB-QUIT\n")
        assert agent.proc.wait(10) == 0
    finally:
        agent.close()


@needs_busybox
def test_the_agent_answers_a_hello_with_the_machine_and_its_library(tmp_path):
    kexec.disk(tmp_path / "disk.img", {"manifest": b"base 00aa debian:6.12\n"
                                                   b"k1 11bb debian:7.3\n"}, "test")
    agent = PtyAgent(tmp_path)
    try:
        deadline = time.monotonic() + 30
        agentlink.expect(agent.link, "MMLAB-AGENT-READY", deadline)
        agent.link.send(b"MMLAB-HELLO\n")
        machine = agentlink.expect(agent.link, "MMLAB-MACHINE", deadline)
        assert machine.args[0] == str(os.cpu_count()) and machine.args[1].isdigit()
        assert [agentlink.expect(agent.link, "MMLAB-ENTRY", deadline).args for _ in "12"] == \
            [("base", "00aa", "debian:6.12"), ("k1", "11bb", "debian:7.3")]
        assert agentlink.expect(agent.link, "MMLAB-AGENT-READY", deadline)
    finally:
        agent.close()


@needs_busybox
@pytest.mark.parametrize("back, kexec_l, said", [
    ("kexec", 0, ["MMLAB-KEXEC back"]),
    ("kexec", 1, ["MMLAB-REBOOT n1 no way back by kexec: kexec -l: refused", "rebooted"]),
    ("reboot", 0, ["MMLAB-REBOOT n1 wired to come back by the boot loader", "rebooted"]),
])
def test_a_kernel_under_test_comes_back_by_kexec_or_else_by_reboot(tmp_path, back, kexec_l,
                                                                   said):
    """Its results go to the disk either way: the base kernel's agent sends them."""
    kexec.disk(tmp_path / "disk.img", {"base.vmlinuz": b"k", "base.initrd": b"i",
                                       "base.append": b"console=ttyS0"}, "test")
    (tmp_path / "kexec").write_text(f"#!/bin/sh\ncase $1 in -l) echo refused; exit {kexec_l};; "
                                    "-e) echo kexec-e >> chan;; esac\n")
    (tmp_path / "kexec").chmod(0o755)
    (tmp_path / "results").write_text("frames\nMMLAB-DONE\n")
    wiring = kexec.Wiring(channel="chan", disk="disk.img", back=back)
    (tmp_path / "machine.sh").write_text(kexec.machine_script(wiring))
    hooks = kexec.HOOKS.replace(". /mmlab/machine.sh\n", ". ./machine.sh; KEXEC=./kexec\n")
    hooks = hooks.replace("/proc/cmdline", "cmdline")
    (tmp_path / "cmdline").write_text("console=ttyS0 mmlab.trial=n1\n")
    out = busybox(hooks.replace("/tmp/", "./") + "reboot() { echo rebooted >> chan; exit 0; }\n"
                  "cp results ./results; deliver; finish\n", tmp_path)
    assert out.returncode == 0, out.stderr
    lines = (tmp_path / "chan").read_text().splitlines()
    assert lines[:2] == ["MMLAB-UP n1 " + os.uname().release, "MMLAB-RAN n1"]
    assert lines[2:] == said + (["kexec-e", "MMLAB-REBOOT n1 no way back by kexec: kexec -e "
                                 "returned", "rebooted"] if said == ["MMLAB-KEXEC back"] else [])
    assert busybox(here(tmp_path, "chan2") + "send_results", tmp_path).returncode == 0
    assert (tmp_path / "chan2").read_text() == "MMLAB-RESULTS n1 18\nframes\nMMLAB-DONE\n"


def framed(stdout: bytes, rc: int = 0) -> str:
    """What /init writes: rc, stdout and stderr framed, then MMLAB-DONE."""
    out = ""
    for name, data in (("rc", f"{rc}\n".encode()), ("stdout", stdout), ("stderr", b"")):
        out += (f"MMLAB-FRAME {name} {hashlib.sha256(data).hexdigest()} {len(data)}\n"
                f"{base64.encodebytes(data).decode()}MMLAB-END {name}\n")
    return out + "MMLAB-DONE\n"


class PlayedAgent(threading.Thread):
    """A machine's agent played over a socket: each trial request is
    answered with the markers a machine says, `pause` s apart, and the
    results `answer(entry)` gives, or silence after MMLAB-UP when it gives None."""

    def __init__(self, sock: socket.socket, answer, pause: float = 0.01, back: str = "kexec"):
        super().__init__(daemon=True)
        self.sock, self.answer, self.pause, self.back = sock, answer, pause, back
        self.requests: list[tuple[str, str]] = []

    def say(self, text: str) -> None:
        time.sleep(self.pause)
        self.sock.sendall(text.encode())

    def run(self) -> None:
        stream = self.sock.makefile("rb")
        try:
            self.say("noise\x00\xffMMLAB-AGENT-UP 6.12\nMMLAB-AGENT-READY\n")
            while (line := stream.readline().decode().split()) and line[0] == "MMLAB-TRIAL":
                _, entry, nonce, size = line
                append = stream.readline().decode().strip()
                stream.read(int(size))
                self.requests.append((entry, append))
                self.say(f"MMLAB-KEXEC {entry}\n")
                self.say(f"MMLAB-UP {nonce} 7.3\n")
                results = self.answer(entry)
                if results is None:
                    stream.read()                       # hung: until the machine is stopped
                    return
                self.say(f"MMLAB-RAN {nonce}\n")
                self.say("MMLAB-KEXEC back\n" if self.back == "kexec"
                         else f"MMLAB-REBOOT {nonce} no way back by kexec: kexec -e returned\n")
                self.say("MMLAB-AGENT-UP 6.12\n")
                self.say(f"MMLAB-RESULTS {nonce} {len(results)}\n{results}MMLAB-AGENT-READY\n")
        except OSError:
            pass


def test_a_trial_comes_back_with_its_results_and_each_switch_timed():
    ours, theirs = socket.socketpair()
    PlayedAgent(theirs, lambda entry: framed(b"out\n"), pause=0.05).start()
    link = agentlink.Link(ours)
    deadline = time.monotonic() + 10
    agentlink.expect(link, "MMLAB-AGENT-READY", deadline)
    results, switch = agentlink.trial(link, "k1", "console=ttyS0", "true\n", deadline)
    assert results == framed(b"out\n")
    assert all(t >= 0.04 for t in (switch.switch_in_s, switch.trial_s, switch.switch_back_s))
    assert switch.figures()["switch_s"] == round(switch.switch_in_s + switch.switch_back_s, 3)


def test_a_trial_that_came_back_by_a_reboot_still_delivers_and_says_so():
    ours, theirs = socket.socketpair()
    PlayedAgent(theirs, lambda entry: framed(b"out\n"), back="reboot").start()
    link = agentlink.Link(ours)
    deadline = time.monotonic() + 10
    agentlink.expect(link, "MMLAB-AGENT-READY", deadline)
    results, switch = agentlink.trial(link, "k1", "console=ttyS0", "true\n", deadline)
    assert results == framed(b"out\n")
    assert switch.back_by == "reboot" and switch.figures()["switch_back_by"] == "reboot"


def test_a_machine_that_does_not_come_back_fails_its_trial_by_the_watchdog():
    ours, theirs = socket.socketpair()
    PlayedAgent(theirs, lambda entry: None).start()
    link = agentlink.Link(ours)
    agentlink.expect(link, "MMLAB-AGENT-READY", time.monotonic() + 10)
    t0 = time.monotonic()
    with pytest.raises(agentlink.Watchdog, match="waited for MMLAB-RAN .*; the last it said "
                                                 "was MMLAB-UP"):
        agentlink.trial(link, "k1", "", "true\n", time.monotonic() + 0.5)
    assert time.monotonic() - t0 < 5


def test_a_machine_back_on_its_base_kernel_without_results_lost_the_trial():
    ours, theirs = socket.socketpair()
    theirs.sendall(b"MMLAB-AGENT-READY\n")
    link = agentlink.Link(ours)
    agentlink.expect(link, "MMLAB-AGENT-READY", time.monotonic() + 10)
    theirs.sendall(b"MMLAB-KEXEC k1\nMMLAB-AGENT-UP 6.12\nMMLAB-LOST 1234\n")
    with pytest.raises(TrialFailed, match="came back without the trial's results"):
        agentlink.trial(link, "k1", "", "true\n", time.monotonic() + 10)


KERNELS = {name: images.Kernel(name, f"{name[-3:]}.0", name, "0" * 64, "/nonexistent")
           for name in ("local:old", "local:new")}

TWO_KERNELS = """
name = "two-kernels"
workload = "pageout-refault"
bare_metal = true
repetitions = 4
timeout_s = {timeout}
metrics = ["advise_ns_per_page"]
baseline = {{ kernel = "local:old" }}
[params]
mapping-kb = 1024
[matrix]
kernel = ["local:old", "local:new"]
"""


class PlayedMachine:
    """A bare-metal machine whose agent a thread plays (baremetal.Machine)."""

    accelerator = measurements.BARE_METAL
    why = "a thread plays the machine"
    name = "played"
    cmdline = "console=ttyS0"

    def __init__(self, answer):
        self.answer = answer
        self.starts = self.stops = 0
        self.link: agentlink.Link | None = None

    def base(self) -> images.Kernel:
        return KERNELS["local:old"]

    def start(self, kernels):
        self.starts += 1
        self.kernels = {f"k{i}": k for i, k in enumerate(kernels, 1)}
        ours, theirs = socket.socketpair()
        PlayedAgent(theirs, lambda entry: self.answer(self.kernels[entry].name)).start()
        self.link = agentlink.Link(ours)
        agentlink.expect(self.link, "MMLAB-AGENT-READY", time.monotonic() + 10)
        return self.link, {k.name: entry for entry, k in self.kernels.items()}

    def console(self) -> str:
        return ""

    def failure(self, since: int) -> str:
        return ""

    def stop(self) -> None:
        self.stops += 1
        if self.link:
            self.link.close()
        self.link = None

    def environment(self) -> dict[str, object]:
        return {"target": "bare-metal", "machine": self.name, "accelerator": self.accelerator}


def sample_lines(kernel: str, n: int = 1) -> str:
    """What mmwork prints for a trial: advise 100 ns/page on old, 130 on new."""
    value = 130.0 if kernel == "local:new" else 100.0
    return "".join(Sample(workload="pageout-refault", sample=i, mmwork_version="played",
                          params={}, metrics={"advise_ns_per_page": value * (1 + i / 1000)},
                          counts={}, rusage=RUSAGE, vmstat_delta={},
                          state={"kernel": kernel}, errors={}).model_dump_json() + "\n"
                   for i in range(n))


def run_played(tmp_path, monkeypatch, answer, timeout: float = 60):
    monkeypatch.setattr(images, "ready", lambda name, say: KERNELS[name])
    monkeypatch.setattr(images, "fetchable", lambda name: KERNELS[name])
    machine = PlayedMachine(answer)
    target = baremetal.BareMetalTarget(machine, say=lambda line: None)
    outcome = driver.run_experiment(str(tmp_path / "r"), parse(TWO_KERNELS.format(
        timeout=timeout)), driver.Here(TargetPool(make=lambda arm: target)))
    return machine, outcome


def test_every_kernel_runs_on_one_machine_and_says_where(tmp_path, monkeypatch):
    machine, outcome = run_played(tmp_path, monkeypatch,
                                  lambda kernel: framed(sample_lines(kernel).encode()))
    assert (outcome.result.done, outcome.failures) == (8, 0)
    assert (machine.starts, machine.stops) == (1, 1)           # one machine, every kernel
    assert sorted(k.name for k in machine.kernels.values()) == ["local:new", "local:old"]
    envs = Store(tmp_path / "r", create=False).environments(outcome.exp_id)
    assert {e["target"] for e in envs} == {"bare-metal"}
    assert {e["kexec_kernel"] for e in envs} == {"local:old", "local:new"}
    assert all(e["switch_s"] >= 0 and e["cmdline"].startswith("console=ttyS0") for e in envs)
    for samples in outcome.result.measured.by_arm.values():
        for s in samples:
            assert s.state["target"] == "bare-metal" and s.state["accelerator"] == "bare-metal"
            assert s.state["kexec_kernel"] == s.state["kernel"]   # what mmwork saw, ran
            assert s.state["switch_in_s"] >= 0
    (verdict,) = outcome.result.judgement.comparisons
    assert verdict.verdict == "regression" and verdict.ratio == pytest.approx(1.3, rel=0.01)


def test_a_hung_trial_fails_by_the_watchdog_and_the_next_starts_a_fresh_machine(
        tmp_path, monkeypatch):
    answers = iter([framed(sample_lines("local:old").encode()), None])

    def answer(kernel):
        return next(answers, framed(sample_lines(kernel).encode()))

    machine, outcome = run_played(tmp_path, monkeypatch, answer, timeout=1)
    (failed,) = outcome.failed[outcome.exp_id]
    assert re.match(r"local:(old|new) on played: not back within timeout_s = 1: waited for "
                    r"MMLAB-RAN \w+; the last it said was MMLAB-UP", failed.error), failed.error
    envs = Store(tmp_path / "r", create=False).environments(outcome.exp_id)
    assert [e["target"] for e in envs] == ["bare-metal"] * 8     # the failed one's too
    assert outcome.result.done == 7
    assert machine.starts == 2 and machine.stops == 2     # power cycled, then stopped at the end


def test_a_broken_trial_fails_with_what_the_kernel_printed(tmp_path, monkeypatch):
    machine, outcome = run_played(tmp_path, monkeypatch,
                                  lambda kernel: framed(b"", rc=3) if kernel == "local:new"
                                  else framed(sample_lines(kernel).encode()))
    errors = {t.error for t in outcome.failed[outcome.exp_id]}
    assert errors == {"pageout-refault failed in the guest (local:new): exit status 3"}


@pytest.mark.parametrize("change, wanted", [
    ('kernel = "local:k"', 'kernel = "host"'),
    ('kernel = "local:k"', 'kernel = "local:k"\nmemory_mb = 512'),
    ("[[arms]]", '[[arms]]\nset = { cpus = 2 }'),
    ("[[arms]]", '[[arms]]\nset = { swap = "file:64M" }'),
])
def test_a_bare_metal_profile_refuses_what_only_a_guest_has(change, wanted):
    text = """
name = "bm"
workload = "pageout-refault"
bare_metal = true
kernel = "local:k"
repetitions = 1
metrics = ["advise_ns_per_page"]
baseline = "a"
[[arms]]
name = "a"
"""
    parse(text, "bm.toml")
    why = {"host": r"bm.toml:4: bare_metal: kernel = host: name the kernels to kexec into",
           "memory_mb": r"bm.toml:6: memory_mb: a guest's setting: a bare-metal machine has "
                        "its own CPUs and memory",
           "cpus": r"bm.toml:10: arms.set.cpus: a guest's setting",
           "swap": r"'file:64M': a bare-metal machine's disk is not mmlab's to swap to"}
    with pytest.raises(MmlabError, match=next(v for k, v in why.items() if k in wanted)):
        parse(text.replace(change, wanted), "bm.toml")


def test_a_bare_metal_arm_names_one_target_for_every_kernel():
    plan = parse(TWO_KERNELS.format(timeout=60))
    assert {a.target for a in plan.arms} == {"bare-metal"}
    one = single.plan(single.Request("pageout-refault", kernel="local:k", bare_metal=True))
    assert [(a.target, a.kernel) for a in one.arms] == [("bare-metal", "local:k")]


@pytest.mark.parametrize("spec, wanted", [
    (None, r"bare_metal = true: name the machine in \$MMLAB_BARE_METAL"),
    ("lab-box", "MMLAB_BARE_METAL='lab-box': expected a machine file .* or simulated:KERNEL"),
    ("simulated:", "or simulated:KERNEL"),
    ("simulated:host", "or simulated:KERNEL"),
    ("simulated:debian:6", "or simulated:KERNEL"),
    ("/nonexistent/box1.toml", "/nonexistent/box1.toml: cannot read the machine file"),
])
def test_the_machine_is_named_in_the_environment_or_refused_in_one_line(monkeypatch, spec,
                                                                         wanted):
    if spec is None:
        monkeypatch.delenv(baremetal.ENV, raising=False)
    else:
        monkeypatch.setenv(baremetal.ENV, spec)
    with pytest.raises(MmlabError, match=wanted) as err:
        baremetal.machine(print)
    assert "\n" not in str(err.value)


def test_a_simulated_machine_is_named_by_its_base_kernel(monkeypatch):
    monkeypatch.setenv(baremetal.ENV, "simulated:debian:6.12")
    made = baremetal.machine(print)
    assert isinstance(made, simulated.SimulatedMachine) and made.name == "simulated:debian:6.12"
    assert made.accelerator == "bare-metal (simulated: TCG guest)"


def test_a_bad_machine_is_refused_before_anything_is_stored(tmp_path, monkeypatch):
    monkeypatch.setenv(baremetal.ENV, "ipmi:lab-box")
    proc, results = run_profile(tmp_path, TWO_KERNELS.format(timeout=60))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "mmlab: MMLAB_BARE_METAL='ipmi:lab-box': expected a machine file (NAME.toml) or "
        "simulated:KERNEL, a TCG guest of KERNEL (debian:6.12, say) standing in for the machine"]
    assert not results.exists()


def test_a_simulated_machines_timings_are_emulated_and_say_where_they_ran():
    def s(accel):
        return Sample(workload="w", sample=0, mmwork_version="x", params={}, metrics={},
                      counts={}, rusage=RUSAGE, vmstat_delta={}, state={"accelerator": accel},
                      errors={})
    by_arm = {"sim": [s(measurements.SIMULATED_BARE_METAL)], "real": [s("bare-metal")]}
    assert measurements.tcg_arms(by_arm) == {"sim"}
    notes = accelerator_notes(by_arm)
    assert any("bare-metal (simulated: TCG guest) for 1 arm(s)" in n and "emulated" in n
               for n in notes)
    assert any(n == "accelerator: bare-metal for 1 arm(s): kexec'd on the machine"
               for n in notes)


SIMULATED_PROFILE = """
name = "kexec-6.12-7.3"
workload = "pageout-refault"
bare_metal = true
repetitions = 3
timeout_s = 300
cmdline = "damon_stat.enabled=N"   # 7.3 starts DAMON at boot, 6.12 does not
metrics = ["advise_ns_per_page"]
baseline = { kernel = "debian:6.12" }
[params]
mapping-kb = 1024
rounds = 2
min-ms = 0
[matrix]
kernel = ["debian:6.12", "debian:7.3"]
"""


@pytest.mark.slow
def test_two_kernels_three_rounds_on_a_simulated_machine_by_kexec(k612, k73, tmp_path,
                                                                  monkeypatch):
    """debian:6.12 against debian:7.3, three rounds, every trial kexec'd from
    a TCG guest of 6.12 into its kernel and back: the samples were measured
    by the kernel named, the machine started once, and the verdict and the
    text report say the machine was a TCG guest (about 3 minutes here)."""
    monkeypatch.setenv(baremetal.ENV, "simulated:debian:6.12")
    proc, results = run_profile(tmp_path, SIMULATED_PROFILE, "--no-controls", timeout=1800)
    assert proc.returncode == 0, proc.stderr
    assert "not comparable" not in proc.stdout          # the profile's cmdline reached 7.3
    assert "bare-metal (simulated: TCG guest) for 2 arm(s)" in proc.stdout
    assert "emulated" in proc.stdout
    store = Store(results, create=False)
    assert [t.status for t in store.trials(1)] == ["done"] * 6
    envs = store.environments(1)
    for env in envs:
        assert env["machine"] == "simulated:debian:6.12"
        assert env["accelerator"] == "bare-metal (simulated: TCG guest)"
        assert 0 < env["switch_in_s"] < 120 and 0 < env["switch_back_s"] < 120
        assert env["cmdline"].endswith("rdinit=/init damon_stat.enabled=N")
    assert sorted(e["kexec_kernel"] for e in envs) == ["debian:6.12"] * 3 + ["debian:7.3"] * 3
    releases = {arm: {s.state["kernel"] for s in ss}
                for arm, ss in store.measurements(1).by_arm.items()}
    assert releases == {"kernel=debian:6.12": {k612.version}, "kernel=debian:7.3": {k73.version}}
    report = mmlab("report", "1", "--results", str(results))
    assert "kernels kexec'd on the machine: bare-metal (simulated: TCG guest) (emulated" \
        in report.stdout, report.stdout + report.stderr
    print(json.dumps([{k: e[k] for k in ("kexec_kernel", "switch_in_s", "switch_back_s",
                                         "kexec_load_s", "machine_boot_s")} for e in envs]))
