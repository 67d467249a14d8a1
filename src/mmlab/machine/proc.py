"""Running the external tools mmlab drives (apt, dpkg, perf, make, swapon).

One error policy for all of them: a tool that is missing, hangs or fails
becomes an MmlabError that names the command and its last words, so the CLI
prints one line and exits non-zero instead of a traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

from mmlab.errors import MmlabError


def call(argv: Sequence[str | Path], *, what: str = "", cwd: str | Path | None = None,
         timeout: float | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run `argv` with its output captured; `what` names it in errors.
    With check=False a non-zero exit is the caller's to judge."""
    what = what or " ".join(map(str, argv[:2]))
    try:
        proc = _run(list(map(str, argv)), cwd, timeout)
    except FileNotFoundError as exc:
        raise MmlabError(f"{argv[0]}: not installed (make setup installs what mmlab uses)") from exc
    except subprocess.TimeoutExpired as exc:
        raise MmlabError(f"{what}: no answer after {timeout:g} s") from exc
    if check and proc.returncode:
        raise MmlabError(f"{what} failed (exit {proc.returncode}): {last_words(proc)}")
    return proc


def _run(argv: list[str], cwd: str | Path | None, timeout: float | None
         ) -> subprocess.CompletedProcess:
    """subprocess.run in a process group of the tool's own, killed whole when
    it times out or mmlab is stopped (a stress-ng's workers, a make's
    compilers), not only the tool's first process."""
    with subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, process_group=0) as child:
        try:
            out, err = child.communicate(timeout=timeout)
        except BaseException:
            if child.returncode is None:    # not reaped: the group's id is still its own
                with suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            raise
    return subprocess.CompletedProcess(argv, child.returncode, out, err)


def last_words(proc: subprocess.CompletedProcess, lines: int = 3) -> str:
    """The last lines a failed command printed, joined on one line."""
    tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-lines:]
    return " | ".join(line.strip() for line in tail) or "(no output)"
