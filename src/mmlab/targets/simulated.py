"""A TCG guest of one kernel standing in for a bare-metal machine, so that
the bare-metal target (baremetal.py) and the agent (kexec.py) run, and are
tested, where no machine can be kexec'd.

The guest boots the base kernel with the agent as mmlab's /init runs it; its
second serial port is the agent's channel (a socket here); its virtio disk
is the machine's raw disk, written here with the library of kernels before
it boots.  It stays up across a run's trials and switches kernels by kexec
as a real machine would.  A power cycle is its QEMU stopped; the next trial
starts it again from the base kernel, as a machine's boot loader would.
Every figure it gives is emulated time, and its samples say so
(measurements.SIMULATED_BARE_METAL).
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.judge.measurements import SIMULATED_BARE_METAL
from mmlab.kernels import images
from mmlab.targets import kexec, probe
from mmlab.targets.agentlink import Link, expect
from mmlab.targets.boot import (
    CMDLINE,
    Guest,
    connect,
    failure,
    initramfs_cache,
    qemu_argv,
    qemu_version,
    read_text,
    start_qemu,
    tail,
)
from mmlab.workloads.mmwork import TrialFailed

WIRING = kexec.Wiring()     # ttyS1, /dev/vda and virtio_blk, back by kexec
MEMORY_MB = 1024
START_TIMEOUT_S = 180     # the base kernel booted and its agent ready (about 6 s here)
QUIT_TIMEOUT_S = 30


class SimulatedMachine:
    """The machine `simulated:BASE`: a TCG guest of BASE, one vCPU, 1 GiB."""

    accelerator = SIMULATED_BARE_METAL
    cmdline = CMDLINE

    def __init__(self, base: str, say: Callable[[str], None] = print):
        self.name = f"simulated:{base}"
        self.base_name = base
        self.say = say
        self.why = (f"a TCG guest of {base} (1 vCPU, {MEMORY_MB} MiB) stands in for the "
                    "machine; each trial's kernel is kexec'd there and back")
        self.proc: subprocess.Popen | None = None
        self.link: Link | None = None
        self.tmp: tempfile.TemporaryDirectory | None = None
        self.started_s = 0.0     # its last start: boot and agent ready
        self._base: images.Kernel | None = None

    def base(self) -> images.Kernel:
        """The base kernel, fetched now if it must be; refused when it cannot be."""
        if self._base is None:
            got = images.ready(self.base_name, self.say)
            if isinstance(got, MmlabError):
                raise MmlabError(f"the simulated machine {self.name}: {got}")
            self._base = got
        return self._base

    def start(self, kernels: Sequence[images.Kernel]) -> tuple[Link, dict[str, str]]:
        """Write the disk with the base kernel and `kernels`, boot the base
        kernel, and wait for its agent: its channel, and each kernel's entry."""
        self.stop()
        self.tmp = tempfile.TemporaryDirectory(prefix="mmlab-machine-")
        tmpd, cache = Path(self.tmp.name), initramfs_cache()
        base = self.base()
        files = kexec.library(base, CMDLINE, kernels, WIRING, cache, tmpd, self.say)
        disk = kexec.disk(tmpd / "disk.img", files, self.name)
        initrd = files["base.initrd"]
        assert isinstance(initrd, Path)
        sock = tmpd / "agent.sock"
        argv = qemu_argv(Guest(base, memory_mb=MEMORY_MB), initrd, "tcg", tmpd / "console.log",
                         ["-chardev", f"socket,id=agent,path={sock},server=on,wait=off",
                          "-serial", "chardev:agent"], disk)
        t0 = time.monotonic()
        self.proc = start_qemu(argv, "tcg", 1)
        deadline = t0 + START_TIMEOUT_S
        self.link = Link(connect(self.proc, sock, deadline))
        try:
            expect(self.link, "MMLAB-AGENT-READY", deadline)
        except TrialFailed as exc:
            console = self.console()
            self.stop()
            raise TrialFailed(f"the simulated machine {self.name} did not start: {exc}; "
                              f"console: {tail(console)}") from exc
        self.started_s = time.monotonic() - t0
        return self.link, {name: entry for name, (entry, _) in kexec.held(files).items()
                           if name != "base"}

    def console(self) -> str:
        """What the machine's serial console has printed since it started."""
        return read_text(Path(self.tmp.name) / "console.log") if self.tmp else ""

    def failure(self, since: int) -> str:
        """A panic or oops its console printed after offset `since`, in words ("" if none)."""
        found = failure(self.console()[since:])
        return f"{found[0]}: {found[1]}" if found else ""

    def stop(self) -> None:
        """Ask the agent to end when it waits for a request, and power off
        (kill) a machine that did not end: one amid a trial is power cycled.
        The port is read until QEMU closes it: the guest's last words wait
        in its UART (a closing tty drains first) until they are read."""
        heard = self.link.last if self.link else None
        if self.link and heard and heard.word == "MMLAB-AGENT-READY" and self.proc \
                and self.proc.poll() is None:
            deadline = time.monotonic() + QUIT_TIMEOUT_S
            try:
                self.link.send(b"MMLAB-QUIT\n")
                while self.link.line(deadline) is not None:
                    pass
            except (OSError, TrialFailed):      # the port closed: the machine is off
                pass
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.link:
            self.link.close()
        if self.tmp:
            self.tmp.cleanup()
        self.proc = self.link = self.tmp = None

    def environment(self) -> dict[str, object]:
        """This host (where the machine's guest runs) and the machine."""
        base = self.base()
        return {**probe.environment(), "target": "bare-metal", "machine": self.name,
                "accelerator": self.accelerator, "accelerator_why": self.why,
                "base_kernel": base.name, "base_kernel_version": base.version,
                "machine_memory_mb": MEMORY_MB, "machine_vcpus": 1, "qemu": qemu_version(),
                "machine_boot_s": round(self.started_s, 3)}
