"""A tracefs session that leaves tracefs as it found it.

Everything a collection pass writes (tracing_on, the buffer size, the
stacktrace option, each event's enable file, the pid filter) is read first
and written back afterwards, and the buffer is emptied: tracing state is a
global setting like any other.

Events are recorded for this process and the ones it starts only
(`set_event_pid` with `options/event-fork`): the workload's own, not a
neighbour's - on a busy machine another program's futex and RCU waits
would otherwise fill the lock pass.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

BASE = ("tracing_on", "buffer_size_kb", "options/stacktrace")
BUFFER_KB = "16384"


def write(path: Path, text: str) -> None:
    path.write_text(text)


@contextmanager
def session(tf: Path, enables: list[str]) -> Iterator[None]:
    """Tracing off and a clean, large buffer inside; `enables` are the event
    enable files (relative to tf) the block may switch on."""
    touched = list(BASE) + enables
    old = {name: (tf / name).read_text().split()[0] for name in touched}
    old_pids = " ".join((tf / "set_event_pid").read_text().split())
    follow = tf / "options/event-fork"
    old_follow = follow.read_text().split()[0] if follow.exists() else None
    write(tf / "tracing_on", "0")
    write(tf / "trace", "")
    write(tf / "buffer_size_kb", BUFFER_KB)
    try:
        if old_follow is not None:
            write(follow, "1")
        write(tf / "set_event_pid", str(os.getpid()))
        yield
    finally:
        write(tf / "tracing_on", "0")
        write(tf / "trace", "")
        write(tf / "set_event_pid", old_pids)
        if old_follow is not None:
            write(follow, old_follow)
        for name in reversed(touched):
            write(tf / name, old[name])


def overruns(tf: Path) -> int:
    """Events lost because the ring buffer wrapped, over all CPUs."""
    lost = 0
    for stats in tf.glob("per_cpu/cpu*/stats"):
        for line in stats.read_text().splitlines():
            if line.startswith("overrun:"):
                lost += int(line.split()[1])
    return lost


def record(tf: Path, enables: list[str], run: Callable[[], None],
           stacktrace: bool = False) -> tuple[str, int]:
    """Run `run` with the `enables` events on (and a stack trace after each
    event if asked); returns the trace text and the events lost to overruns."""
    with session(tf, enables):
        for e in enables:
            write(tf / e, "1")
        if stacktrace:
            write(tf / "options/stacktrace", "1")
        write(tf / "tracing_on", "1")
        run()
        write(tf / "tracing_on", "0")
        return (tf / "trace").read_text(), overruns(tf)
