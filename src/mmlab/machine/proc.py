"""Running the external tools mmlab drives (apt, dpkg, perf, make, swapon).

One error policy for all of them: a tool that is missing, hangs or fails
becomes an MmlabError that names the command and its last words, so the CLI
prints one line and exits non-zero instead of a traceback.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from mmlab.errors import MmlabError


def call(argv: Sequence[str | Path], *, what: str = "", cwd: str | Path | None = None,
         timeout: float | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run `argv` with its output captured; `what` names it in errors.
    With check=False a non-zero exit is the caller's to judge."""
    what = what or " ".join(map(str, argv[:2]))
    try:
        proc = subprocess.run(list(map(str, argv)), cwd=cwd, capture_output=True, text=True,
                              timeout=timeout)
    except FileNotFoundError as exc:
        raise MmlabError(f"{argv[0]}: not installed (make setup installs what mmlab uses)") from exc
    except subprocess.TimeoutExpired as exc:
        raise MmlabError(f"{what}: no answer after {timeout:g} s") from exc
    if check and proc.returncode:
        raise MmlabError(f"{what} failed (exit {proc.returncode}): {last_words(proc)}")
    return proc


def last_words(proc: subprocess.CompletedProcess, lines: int = 3) -> str:
    """The last lines a failed command printed, joined on one line."""
    tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-lines:]
    return " | ".join(line.strip() for line in tail) or "(no output)"
