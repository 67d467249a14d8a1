"""Debian kernel versions in order: upstream and package versions compared
part by part (dpkg's rules), the release series of a version.
"""

from __future__ import annotations

import re


def _order(c: str) -> int:
    if c == "~":
        return -1
    if c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    return ord(c) + 256



def _cmp_part(a: str, b: str) -> int:
    """dpkg's comparison of an upstream version or revision."""
    i = j = 0
    while i < len(a) or j < len(b):
        diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            bc = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ac != bc:
                return -1 if ac < bc else 1
            i += 1
            j += 1
        ia, jb = i, j
        while i < len(a) and a[i].isdigit():
            i += 1
        while j < len(b) and b[j].isdigit():
            j += 1
        diff = int(a[ia:i] or 0) - int(b[jb:j] or 0)
        if diff:
            return -1 if diff < 0 else 1
    return 0



def compare_versions(a: str, b: str) -> int:
    """Debian package versions compared as dpkg does: -1, 0 or 1."""
    def split(v: str) -> tuple[int, str, str]:
        epoch, _, rest = v.rpartition(":") if ":" in v else ("0", "", v)
        up, _, rev = rest.rpartition("-") if "-" in rest else (rest, "", "0")
        return int(epoch or 0), up, rev
    ea, ua, ra = split(a)
    eb, ub, rb = split(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _cmp_part(ua, ub) or _cmp_part(ra, rb)



class VersionKey:
    def __init__(self, v: str):
        self.v = v

    def __lt__(self, other: VersionKey) -> bool:
        return compare_versions(self.v, other.v) < 0



def upstream(package_version: str) -> str:
    """6.12.117-1~deb12u1 -> 6.12.117; 7.3~rc7-1~exp1 -> 7.3~rc7."""
    return package_version.split(":")[-1].rsplit("-", 1)[0]



def series_of(upstream_version: str) -> str:
    m = re.match(r"(\d+)\.(\d+)", upstream_version)
    return f"{m.group(1)}.{m.group(2)}" if m else upstream_version



def series_key(series: str) -> tuple[int, int]:
    major, minor = series.split(".")
    return int(major), int(minor)


RELEASE = re.compile(r"^(\d+\.\d+)(?:\.(\d+))?(?:-(rc\d+))?")


def release_upstream(release: str) -> str | None:
    """A kernel release as an upstream version that orders as dpkg does:
    6.12.117+deb13-cloud-amd64 -> 6.12.117, 7.3.0-rc7 -> 7.3~rc7, 6.12.0 ->
    6.12 (what Debian calls the first release of a series); None for a
    release that names no version (a local image's "unknown")."""
    m = RELEASE.match(release)
    if not m:
        return None
    patch = f".{m.group(2)}" if m.group(2) and m.group(2) != "0" else ""
    return m.group(1) + patch + (f"~{m.group(3)}" if m.group(3) else "")
