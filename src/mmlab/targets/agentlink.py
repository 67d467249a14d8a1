"""The coordinator's end of a bare-metal machine's serial channel: the
agent's marker lines as they arrive, and one trial's conversation with it
(kexec.py says what the machine does between the markers).

Every step of a kernel switch is timed here, on the coordinator's clock, as
its marker arrives: no clock of the machine runs on across a kexec.  The
trial's deadline is the watchdog: a machine that has not come back with the
results by then fails the trial, naming the last marker it said.  A kernel
that comes back by a reboot instead of a kexec (MMLAB-REBOOT) still
delivers its trial: the base kernel's agent sends what the disk kept.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import select
import time
from dataclasses import dataclass
from typing import Protocol

from mmlab.targets import initramfs
from mmlab.workloads.mmwork import TrialFailed

MARKER = re.compile(r"MMLAB-[A-Z-]+(?: .*)?")
# What the machine says when a trial cannot go on (kexec.py).
FAILED = {"MMLAB-AGENT-ERROR": "the agent", "MMLAB-ERROR": "the kernel under test",
          "MMLAB-LOST": "the agent"}


class MachineGone(TrialFailed):
    """The channel closed: the machine powered off (a simulated one's QEMU ended)."""


class Watchdog(TrialFailed):
    """The machine did not say what it should have said in time."""


@dataclass(frozen=True)
class Heard:
    """A marker line and when it arrived (time.monotonic)."""
    word: str
    args: tuple[str, ...]
    at: float


class Stream(Protocol):
    def fileno(self) -> int: ...

    def close(self) -> None: ...


class Link:
    """The agent's channel over an open stream: a simulated machine's
    serial port is a socket, a serial line or a pty a file."""

    def __init__(self, stream: Stream):
        self.stream = stream
        self.lines: list[tuple[str, float]] = []
        self.partial = b""
        self.last: Heard | None = None

    def send(self, data: bytes) -> None:
        while data:
            data = data[os.write(self.stream.fileno(), data):]

    def line(self, deadline: float) -> tuple[str, float] | None:
        """The next line and when its end arrived; None at the deadline."""
        while not self.lines:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.stream], [], [], left)[0]:
                return None
            try:
                data = os.read(self.stream.fileno(), 1 << 16)
            except OSError:        # a pty whose other side is gone
                data = b""
            if not data:
                raise MachineGone("the machine's channel closed"
                                  + (f" after it said {self.last.word}" if self.last else ""))
            now = time.monotonic()
            *done, self.partial = (self.partial + data).split(b"\n")
            self.lines += [(ln.decode(errors="replace"), now) for ln in done]
        return self.lines.pop(0)

    def marker(self, deadline: float) -> Heard | None:
        """The next marker line, skipping anything else (a port's noise
        while a kernel takes it over); None at the deadline."""
        while (got := self.line(deadline)) is not None:
            found = MARKER.search(got[0])
            if found:
                word, *args = found.group(0).split()
                self.last = Heard(word, tuple(args), got[1])
                return self.last
        return None

    def close(self) -> None:
        self.stream.close()


def expect(link: Link, word: str, deadline: float, first: str | None = None) -> Heard:
    """Wait for `word` (its first argument `first`, if given); a failure the
    machine reports, or the deadline, fails the trial."""
    return expect_one(link, [(word, first)], deadline)


def expect_one(link: Link, wanted: list[tuple[str, str | None]], deadline: float) -> Heard:
    """Wait for the first of `wanted` (word, first argument or None)."""
    while (heard := link.marker(deadline)) is not None:
        if heard.word in FAILED:
            raise TrialFailed(f"{FAILED[heard.word]} on the machine: "
                              + ("the machine came back without the trial's results "
                                 "(it rebooted)" if heard.word == "MMLAB-LOST"
                                 else " ".join(heard.args)))
        if any(heard.word == word and (first is None or heard.args[:1] == (first,))
               for word, first in wanted):
            return heard
    said = " or ".join(f"{word} {first}" if first else word for word, first in wanted)
    raise Watchdog(f"waited for {said}"
                   + (f"; the last it said was {link.last.word}"
                      f" {' '.join(link.last.args[:1])}".rstrip() if link.last else
                      "; it said nothing"))


@dataclass(frozen=True)
class Switch:
    """What a trial's kernel switches cost, in seconds on the coordinator's clock."""
    load_in_s: float      # the request sent -> the agent about to kexec (read, kexec -l)
    switch_in_s: float    # its kexec -e -> the kernel under test's /init runs
    trial_s: float        # that /init -> the trial's results on the disk
    load_back_s: float    # -> about to kexec back (base kernel read, kexec -l) or reboot
    switch_back_s: float  # its kexec -e (or reboot) -> the base kernel's agent runs
    back_by: str = "kexec"   # or "reboot": through the machine's boot loader

    @property
    def switch_s(self) -> float:
        """A kernel switch there and back: kexec -e until the next /init, twice."""
        return self.switch_in_s + self.switch_back_s

    def figures(self) -> dict[str, float | str]:
        return {"kexec_load_s": round(self.load_in_s + self.load_back_s, 3),
                "switch_in_s": round(self.switch_in_s, 3),
                "switch_back_s": round(self.switch_back_s, 3),
                "switch_s": round(self.switch_s, 3), "switch_back_by": self.back_by}


def request(entry: str, nonce: str, append: str, script: str) -> bytes:
    """A trial as the agent reads it: verb, kernel, nonce and size; the
    kernel's command line; the trial's /trial.sh archive in base64."""
    payload = base64.encodebytes(initramfs.script_archive(script))
    return f"MMLAB-TRIAL {entry} {nonce} {len(payload)}\n{append}\n".encode() + payload


def trial(link: Link, entry: str, append: str, script: str,
          deadline: float) -> tuple[str, Switch]:
    """Run `script` under the library's kernel `entry` and come back: the
    framed results (as a guest's ttyS1 carries them) and what the switches cost."""
    nonce = secrets.token_hex(8)
    start = time.monotonic()
    link.send(request(entry, nonce, append, script))
    steps = [("MMLAB-KEXEC", entry), ("MMLAB-UP", nonce), ("MMLAB-RAN", nonce)]
    times = [start] + [expect(link, word, deadline, first).at for word, first in steps]
    back = expect_one(link, [("MMLAB-KEXEC", "back"), ("MMLAB-REBOOT", nonce)], deadline)
    times += [back.at, expect(link, "MMLAB-AGENT-UP", deadline).at]
    results = collect(link, nonce, deadline)
    expect(link, "MMLAB-AGENT-READY", deadline)
    load_in, switch_in, ran, load_back, switch_back = (b - a for a, b in zip(times, times[1:]))
    return results, Switch(load_in, switch_in, ran, load_back, switch_back,
                           "reboot" if back.word == "MMLAB-REBOOT" else "kexec")


def collect(link: Link, nonce: str, deadline: float) -> str:
    """The results the agent sends for `nonce`: its lines up to MMLAB-DONE."""
    expect(link, "MMLAB-RESULTS", deadline, nonce)
    lines = []
    while (got := link.line(deadline)) is not None:
        lines.append(got[0])
        if got[0] == "MMLAB-DONE":
            return "\n".join(lines) + "\n"
    raise Watchdog(f"the results of the trial stopped after {len(lines)} lines")
