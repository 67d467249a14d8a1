"""A TOML file's text (a profile, a tracker's suite, a census recipe), read
with nothing but the standard library: the checks a typo trips over (no
such file, a directory, a FIFO, not UTF-8) answer before pydantic and the
workloads' table are loaded."""

from __future__ import annotations

from pathlib import Path

from mmlab.errors import MmlabError


def read(path: str | Path, kind: str = "profile") -> str:
    """The text of the `kind` (profile, suite, recipe) at `path`.  Only a
    regular file of UTF-8 text is read (a FIFO would hang, a binary would
    fail as a traceback)."""
    path = Path(path)
    if not path.is_file():
        raise MmlabError(f"{path}: " + ("not a regular file" if path.exists()
                                        else f"no such {kind}"))
    try:
        return path.read_text()
    except OSError as exc:
        raise MmlabError(f"{path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise MmlabError(f"{path}: not a TOML {kind} (not UTF-8 text at byte {exc.start})") \
            from exc
