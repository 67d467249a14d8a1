"""A real bare-metal machine's link: its machine file, staging its library,
its agent reached over a serial line, power cycling it.  The machine is a
box (box.py): a TCG guest wired as a lab wires a machine, a tty, a disk
and a power command, and reached through nothing else.  Fast: bad machine
files and power commands; the box staged, checked and running a trial by
kexec.  Slow: a hung trial power cycled; a machine that comes back by its
boot loader.  A fleet worker driving a box over two kernels and three
rounds is test_fleet's."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mmlab.errors import MmlabError
from mmlab.store import Store
from mmlab.targets import agentlink, baremetal, realmachine
from mmlab.targets.agentlink import Watchdog

from . import box
from .conftest import mmlab

GOOD = {"name": "box1", "base": "debian:6.12", "serial": "/dev/ttyUSB0",
        "channel": "/dev/ttyS1", "disk": "/dev/sd*"}


def toml(values: dict) -> str:
    return "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())


@pytest.fixture
def silent_line(tmp_path):
    """A serial line that opens and on which no agent answers: a pty no
    one reads, linked at a fixed path as a USB adapter's would be."""
    master, slave = os.openpty()
    line = tmp_path / "tty"
    line.symlink_to(os.ttyname(slave))
    yield str(line)
    os.close(master)
    os.close(slave)


def power_script(tmp_path, body: str) -> str:
    """A power_cycle command that records that it ran (tmp_path/powered)."""
    script = tmp_path / "power"
    script.write_text(f"#!/bin/sh\ntouch {tmp_path / 'powered'}\n{body}\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("change, wanted", [
    ({"colour": "red"}, "unknown key 'colour' (a machine file knows name, base, serial"),
    ({"serial": None}, "serial is missing (a machine file needs name, base, serial"),
    ({"baud": "fast"}, "baud = 'fast': expected int"),
    ({"baud": 123}, "baud = 123: expected a serial line's speed"),
    ({"base": "host"}, "base = 'host': expected a kernel mmlab fetches or builds"),
    ({"back": "pxe"}, "back = 'pxe': expected kexec or reboot"),
    ({"name": "box 1"}, "name = 'box 1': expected letters, digits"),
    ({"boot_timeout_s": 0}, "boot_timeout_s = 0: expected seconds, more than 0"),
    ({"power_timeout_s": -1}, "power_timeout_s = -1: expected seconds, more than 0"),
    ({"modules": "ahci"}, "modules = 'ahci': expected list"),
    ({"modules": ["ahci; reboot"]}, "modules = ['ahci; reboot']: expected module names"),
    ({"channel": "ttyS1"}, "channel = 'ttyS1': expected a device under /dev"),
    ({"disk": "/dev/sda $(reboot)"}, "disk = '/dev/sda $(reboot)': expected a device under"),
    ({"console": "ttyS0 quiet"}, "console = 'ttyS0 quiet': expected a console= value"),
])
def test_a_bad_machine_file_is_refused_in_one_line_naming_the_key(tmp_path, change, wanted):
    path = tmp_path / "box1.toml"
    path.write_text(toml({k: v for k, v in {**GOOD, **change}.items() if v is not None}))
    with pytest.raises(MmlabError) as err:
        realmachine.load(path)
    assert str(err.value).startswith(f"{path}: {wanted}")
    assert "\n" not in str(err.value)


def test_a_binary_machine_file_is_refused_in_one_line_naming_it(tmp_path):
    """Staging it, or running on the machine it would name: one line, no
    traceback, nothing stored."""
    path = tmp_path / "bin.toml"
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe\x80")
    wanted = f"{path}: not a text file (a machine file is TOML)"
    with pytest.raises(MmlabError, match="^" + re.escape(wanted) + "$"):
        realmachine.load(path)
    results = tmp_path / "r"
    for command in (("bare-metal", "stage", str(path), "--kernels", "debian:6.12",
                     "--output", str(tmp_path / "out")),
                    ("run", "pageout-refault", "--kernel", "debian:6.12", "--bare-metal",
                     "--samples", "1", "--results", str(results))):
        done = mmlab(*command, timeout=300, env={baremetal.ENV: str(path)})
        assert (done.returncode, done.stderr) == (2, f"mmlab: {wanted}\n"), done.stdout
    assert not (tmp_path / "out").exists() and not results.exists()


def test_staging_for_a_base_kernel_that_cannot_be_had_creates_nothing(tmp_path, k612):
    """Everything checked first (the output, the base kernel, the kernels),
    then --output made: a refused stage leaves no directory behind."""
    path = tmp_path / "box1.toml"
    path.write_text(toml({**GOOD, "base": "local:nonexistent"}))
    out = tmp_path / "deep" / "out"
    done = mmlab("bare-metal", "stage", str(path), "--kernels", "debian:6.12",
                 "--output", str(out), timeout=600)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"mmlab: {path}: base = 'local:nonexistent': ")
    assert done.stderr.count("\n") == 1
    assert not (tmp_path / "deep").exists()
    (tmp_path / "file").write_text("")
    path.write_text(toml(GOOD))
    done = mmlab("bare-metal", "stage", str(path), "--kernels", "debian:6.12",
                 "--output", str(tmp_path / "file"), timeout=600)
    assert (done.returncode, done.stderr) == (2, f"mmlab: --output {tmp_path / 'file'}: "
                                                 "not a directory\n")


def test_a_machine_file_names_its_wiring_and_its_command_line(tmp_path, silent_line):
    path = tmp_path / "box1.toml"
    path.write_text(toml({**GOOD, "serial": silent_line, "modules": ["ahci", "sd_mod"],
                          "back": "reboot", "console": "ttyS1,57600"}))
    machine = realmachine.load(path)
    assert machine.wiring == realmachine.kexec.Wiring(
        channel="/dev/ttyS1", disk="/dev/sd*", modules=("ahci", "sd_mod"), baud=115200,
        back="reboot")
    assert machine.cmdline.startswith("console=ttyS1,57600 panic=-1 ")
    assert isinstance(baremetal.machine(print, str(path)), realmachine.RealMachine)


@pytest.mark.parametrize("power, wanted", [
    ("", "box1: its agent did not answer, and {path} names no power_cycle command: reset it "
         "by hand"),
    ("echo no BMC answers >&2; exit 3", "box1: power_cycle exited 3: no BMC answers"),
])
def test_a_machine_that_does_not_answer_is_power_cycled_or_said_why_not(tmp_path, k612,
                                                                         monkeypatch, power,
                                                                         wanted, silent_line):
    monkeypatch.setenv("MMLAB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(realmachine, "HELLO_S", 0.2)
    path = tmp_path / "box1.toml"
    path.write_text(toml({**GOOD, "serial": silent_line, "modules": [], "power_cycle": power}))
    machine = realmachine.RealMachine(realmachine.load(path), say=lambda line: None)
    with pytest.raises(MmlabError) as err:
        machine.start([k612])
    assert str(err.value) == wanted.format(path=path)
    assert machine.held is None                     # the machine let go of


def test_a_serial_line_that_cannot_be_opened_is_refused_and_nothing_power_cycled(tmp_path,
                                                                              k612,
                                                                              monkeypatch):
    """A device that is not there is refused as the machine is named,
    before any kernel is fetched or library built; one that is there but no
    serial line is refused as the line is opened: each in one line naming
    the device and the file, and the power command never runs."""
    monkeypatch.setenv("MMLAB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(realmachine, "HELLO_S", 0.2)
    path = tmp_path / "box1.toml"
    power = power_script(tmp_path, "exit 0")
    path.write_text(toml({**GOOD, "serial": "/dev/ttyDOESNOTEXIST", "modules": [],
                          "power_cycle": power, "boot_timeout_s": 1}))
    with pytest.raises(MmlabError) as err:
        realmachine.RealMachine(realmachine.load(path), say=lambda line: None).start([k612])
    assert str(err.value) == (f"{path}: serial = '/dev/ttyDOESNOTEXIST': cannot open the line "
                              "(No such file or directory); check the device's name and its "
                              "cabling")
    path.write_text(toml({**GOOD, "serial": "/dev/null", "modules": [], "power_cycle": power,
                          "boot_timeout_s": 1}))
    machine = realmachine.RealMachine(realmachine.load(path), say=lambda line: None)
    with pytest.raises(MmlabError) as err:
        machine.start([k612])
    assert str(err.value) == (f"{path}: serial = '/dev/null': cannot open the line (not a "
                              "serial line (Inappropriate ioctl for device)); check the "
                              "device's name and its cabling")
    assert machine.held is None
    assert not (tmp_path / "powered").exists()


@pytest.mark.parametrize("command", [
    ("bare-metal", "check", "{path}", "--kernels", "debian:6.12"),
    ("run", "pageout-refault", "--kernel", "debian:6.12", "--bare-metal", "--samples", "1",
     "--results", "{results}"),
])
def test_a_machine_file_naming_no_device_is_refused_before_anything(tmp_path, k612, command):
    """`bare-metal check` and a run on the machine refuse a serial device
    that is not there in one line, and nothing is stored or power cycled."""
    path = tmp_path / "box1.toml"
    path.write_text(toml({**GOOD, "serial": "/dev/ttyDOESNOTEXIST", "boot_timeout_s": 1,
                          "power_cycle": power_script(tmp_path, "exit 0")}))
    results = tmp_path / "r"
    done = mmlab(*(a.format(path=path, results=results) for a in command), timeout=300,
                 env={baremetal.ENV: str(path), "MMLAB_STATE_DIR": str(tmp_path / "state")})
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (f"mmlab: {path}: serial = '/dev/ttyDOESNOTEXIST': cannot open the "
                           "line (No such file or directory); check the device's name and its "
                           "cabling\n")
    assert not (tmp_path / "powered").exists() and not results.exists()


def test_a_power_command_that_hangs_is_killed_with_every_process_it_started(tmp_path,
                                                                           silent_line):
    """power_cycle is bounded by power_timeout_s; at the bound its whole
    process group is killed (a child it waits for too), said in one line."""
    path = tmp_path / "box1.toml"
    power = power_script(tmp_path, f"cut -d' ' -f5 /proc/$$/stat > {tmp_path / 'group'}\n"
                                   "sleep 1000\necho never")
    path.write_text(toml({**GOOD, "serial": silent_line, "power_cycle": power,
                          "power_timeout_s": 1}))
    machine = realmachine.RealMachine(realmachine.load(path), say=lambda line: None)
    t0 = time.monotonic()
    with pytest.raises(MmlabError) as err:
        machine.power_cycle("a test")
    assert time.monotonic() - t0 < 10           # one second, and the kill; not 120 s
    assert str(err.value) == ("box1: power_cycle did not end within power_timeout_s = 1 s; "
                              "it and every process it started were killed")
    group = (tmp_path / "group").read_text().strip()
    deadline = time.monotonic() + 5             # killed at once; reaped by whoever adopts them
    while (alive := group_members(group)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive


def group_members(group: str) -> list[str]:
    """The live (not zombie) processes of process group `group`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            state, _, pgrp = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:3]
        except OSError:
            continue                             # ended while we looked
        if pgrp == group and state != "Z":
            found.append(pid)
    return found


def test_two_mmlab_runs_take_turns_on_one_machine(tmp_path, k612, monkeypatch, silent_line):
    """A second mmlab driving the machine waits for the first to let go of
    it, saying for whom, before it says anything on the line."""
    monkeypatch.setenv("MMLAB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(realmachine, "HELLO_S", 0.2)
    path = tmp_path / "box1.toml"
    path.write_text(toml({**GOOD, "serial": silent_line, "modules": []}))
    lock = tmp_path / "state" / "bare-metal-box1.lock"
    lock.parent.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, os, sys
f = open({str(lock)!r}, "a+")
fcntl.flock(f, fcntl.LOCK_EX)
f.write(f"{{os.getpid()}}\\n"); f.flush()
print("held", flush=True)
sys.stdin.read()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    said: list[str] = []
    machine = realmachine.RealMachine(realmachine.load(path), say=said.append)
    failed: list[BaseException] = []

    def start() -> None:
        try:
            machine.start([k612])
        except BaseException as exc:          # noqa: BLE001 (checked below)
            failed.append(exc)
    second = threading.Thread(target=start)
    second.start()
    deadline = time.monotonic() + 120            # the library is built first
    while not said and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    assert second.is_alive()                     # still waiting while the first holds it
    holder.stdin.close()                         # the first lets go
    second.join(60)
    assert len(failed) == 1 and isinstance(failed[0], MmlabError)
    assert "names no power_cycle command" in str(failed[0])
    assert said == [f"box1: waiting for mmlab pid {holder.pid}, which drives it ({lock})"]
    holder.wait()
    machine.stop()
    assert machine.held is None


@pytest.fixture
def wired(tmp_path):
    """A box wired with a virtio disk, powered off at the end."""
    machine = box.wire(tmp_path)
    yield machine
    box.off(tmp_path)


def test_a_real_machines_library_staged_checked_and_a_trial_kexeced_there(wired, k612, k73,
                                                                         tmp_path):
    """The box, off, staged with 7.3 only: check powers it on and names
    what it is; a kernel its library lacks is refused in one line that says
    how to stage it; a trial of 7.3 runs there by kexec and comes back,
    its samples saying the machine they ran on and what the switches cost."""
    staged = mmlab("bare-metal", "stage", str(wired), "--kernels", "debian:7.3",
                   "--output", str(tmp_path), timeout=600)
    assert staged.returncode == 0, staged.stderr
    assert "box: 1 kernel(s) and its base debian:6.12 staged" in staged.stdout
    assert (tmp_path / "library.img").read_bytes()[64 << 20:][:18] == b"MMLAB-LIBRARY box\n"

    checked = mmlab("bare-metal", "check", str(wired), "--kernels", "debian:7.3", timeout=600)
    assert checked.returncode == 0, checked.stderr + checked.stdout
    assert checked.stdout.splitlines()[0] == "box: power cycling it (its agent did not answer)"
    assert "box: 1 CPUs (QEMU TCG CPU version" in checked.stdout
    assert f"its agent on {k612.version}" in checked.stdout
    assert "debian:7.3: staged as k1, current" in checked.stdout

    lacking = mmlab("bare-metal", "check", str(wired), "--kernels", "debian:6.12,debian:7.3",
                    timeout=600)
    assert lacking.returncode == 2
    assert lacking.stderr.strip() == (
        f"mmlab: box: its library lacks debian:6.12 as this mmlab stages them; stage it "
        f"again (mmlab bare-metal stage {wired} --kernels debian:6.12,debian:7.3) and write "
        "it to the machine")

    results = tmp_path / "r"
    ran = mmlab("run", "pageout-refault", "--kernel", "debian:7.3", "--bare-metal",
                "--samples", "2", "--mapping-kb", "4096", "--rounds", "2", "--min-ms", "0",
                "--results", str(results), timeout=600, env={baremetal.ENV: str(wired)})
    assert ran.returncode == 0, ran.stderr
    assert "accelerator: bare-metal for 1 arm(s)" in ran.stdout
    env = Store(results, create=False).environments(1)[0]
    assert env["machine"] == "box" and env["accelerator"] == "bare-metal"
    assert env["kexec_kernel"] == "debian:7.3" and env["kernel"] == k612.version
    assert env["switch_back_by"] == "kexec" and 0 < env["switch_in_s"] < 120
    samples = Store(results, create=False).measurements(1).by_arm["run"]
    assert {s.state["kernel"] for s in samples} == {k73.version}
    assert {s.state["machine"] for s in samples} == {"box"}


@pytest.mark.slow
def test_a_hung_trial_is_power_cycled_and_a_machine_can_come_back_by_reboot(tmp_path, k612,
                                                                           k73):
    """A trial that never ends fails by its watchdog, naming the last word
    the machine said; the machine is power cycled and the next start finds
    its agent.  Wired to come back by its boot loader, a trial's kernel
    reboots and the base kernel's agent still delivers the results."""
    machine_file = box.wire(tmp_path, back="reboot")
    staged = mmlab("bare-metal", "stage", str(machine_file), "--kernels", "debian:7.3",
                   "--output", str(tmp_path), timeout=1800)
    assert staged.returncode == 0, staged.stderr
    said: list[str] = []
    machine = realmachine.RealMachine(realmachine.load(machine_file), say=said.append)
    try:
        link, entries = machine.start([k73])
        with pytest.raises(Watchdog, match="waited for MMLAB-RAN .*; the last it said was "
                                           "MMLAB-UP"):
            agentlink.trial(link, entries["debian:7.3"], machine.cmdline, "sleep 1000\n",
                            time.monotonic() + 60)
        machine.stop()
        assert said[-1] == "box: power cycling it (it was left amid a trial)"
        link, entries = machine.start([k73])
        t0 = time.monotonic()
        results, switch = agentlink.trial(link, entries["debian:7.3"], machine.cmdline,
                                          "uname -r\n", time.monotonic() + 300)
        print(f"trial with a reboot back: {time.monotonic() - t0:.1f} s, {switch.figures()}")
    finally:
        machine.stop()
        box.off(tmp_path)
    assert switch.back_by == "reboot" and switch.switch_back_s > 0
    assert base64.b64encode(f"{k73.version}\n".encode()).decode() in results
