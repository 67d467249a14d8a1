"""A profile's text, read with nothing but the standard library: the
checks a typo trips over (no such file, a directory, a FIFO, not UTF-8)
answer before pydantic and the workloads' table are loaded."""

from __future__ import annotations

from pathlib import Path

from mmlab.errors import MmlabError


def read(path: str | Path) -> str:
    """The profile's text.  Only a regular file of UTF-8 text is read (a
    FIFO would hang)."""
    path = Path(path)
    if not path.is_file():
        raise MmlabError(f"{path}: " + ("not a regular file" if path.exists()
                                        else "no such profile"))
    try:
        return path.read_text()
    except OSError as exc:
        raise MmlabError(f"{path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise MmlabError(f"{path}: not a TOML profile (not UTF-8 text at byte {exc.start})") \
            from exc
