"""What a `--kernel` or profile names: `debian:6.12`, `debian:6.12.115`,
`-generic`, and release ranges `debian:6.12..debian:7.3` (one kernel per
series the catalog has), resolved against the catalog.
"""

from __future__ import annotations

import re

from mmlab.errors import MmlabError
from mmlab.kernels.catalog import Apt, Entry, entries, series_available
from mmlab.kernels.versions import VersionKey, series_key

SPEC = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:-(cloud|generic))?$")



def parse_spec(spec: str) -> tuple[str, str | None, str]:
    """'6.12' -> ('6.12', None, 'cloud'); '6.12.115-generic' -> ('6.12', '6.12.115', 'generic')."""
    m = SPEC.match(spec)
    if not m:
        raise MmlabError(f"debian:{spec}: expected debian:MAJOR.MINOR[.PATCH][-generic], "
                         "e.g. debian:6.12 or debian:7.3.4")
    series = f"{m.group(1)}.{m.group(2)}"
    return series, f"{series}.{m.group(3)}" if m.group(3) else None, m.group(4) or "cloud"



def resolve(spec: str, apt: Apt | None = None) -> Entry:
    """'6.12' or '6.12.115' (or ...-generic) -> the newest matching catalog entry."""
    return _newest(spec, (apt or Apt()).catalog())


def check(spec: str, apt: Apt | None = None) -> Entry:
    """Refuse a Debian kernel the catalog does not serve, in one line, before
    a store is made or a fetch begins; the entry it would fetch otherwise
    (narrow orders kernels by its version).  The catalog as last read
    answers, downloading nothing; only a name it lacks, when it is out of
    date, is looked up again in a fresh one (a fetch would read one anyway)."""
    apt = apt or Apt()
    last = apt.last_catalog()
    if last is not None:
        try:
            return _newest(spec, last)
        except MmlabError:
            if apt.fresh():
                raise
    return resolve(spec, apt)


def _newest(spec: str, catalog: list[dict]) -> Entry:
    """`resolve` in `catalog` (rows as Apt.catalog gives them)."""
    series, exact, flavour = parse_spec(spec)
    all_entries = [e for e in entries(catalog) if e.flavour == flavour]
    mine = [e for e in all_entries if e.series == series
            and (exact is None or e.upstream == exact or e.upstream.startswith(exact + "+"))]
    if not mine:
        known = sorted({e.series for e in all_entries}, key=series_key)
        if any(e.series == series for e in all_entries):
            have = ", ".join(sorted({e.upstream for e in all_entries if e.series == series},
                                    key=VersionKey)[-6:])
            raise MmlabError(f"debian:{spec}: the Debian catalog has no {exact} {flavour} kernel "
                             f"(its {series} kernels: ... {have})")
        raise MmlabError(f"debian:{spec}: the Debian catalog has no {series} {flavour} kernel "
                         f"(release series it has: {', '.join(known) or 'none'})")
    # A release before a release candidate of the same series: dpkg order does it.
    return max(mine, key=lambda e: VersionKey(e.package_version))



RANGE = re.compile(r"^debian:([0-9.]+(?:-(?:cloud|generic))?)\.\.(?:debian:)?"
                   r"([0-9.]+(?:-(?:cloud|generic))?)?$")



def is_range(name: str) -> bool:
    return isinstance(name, str) and ".." in name



def expand(names: list, apt: Apt | None = None) -> list:
    """Each release range (debian:6.12..debian:7.3) -> one kernel per release
    series the catalog has from the first to the last, both ends as given;
    an open end (debian:6.1..) runs to the newest series the catalog has
    now.  Other names stay as they are."""
    out: list = []
    for name in names:
        if not is_range(name):
            out.append(name)
            continue
        m = RANGE.match(name)
        if not m:
            raise MmlabError(f"{name}: a release range is debian:X.Y..debian:X.Y "
                             "(e.g. debian:6.12..debian:7.3)")
        s0, _, f0 = parse_spec(m.group(1))
        have = series_available(apt, f0)
        last = m.group(2) or (have[-1] + ("" if f0 == "cloud" else f"-{f0}"))
        s1, _, f1 = parse_spec(last)      # debian:6.1.. : open-ended, to the newest series
        if f0 != f1:
            raise MmlabError(f"{name}: both ends of a release range need the same flavour")
        for end in (s0, s1):     # before the order: debian:9.0.. ends older than it starts
            if end not in have:
                raise MmlabError(f"{name}: {end} is not a release series the Debian catalog "
                                 f"has (it has {', '.join(have)})")
        if series_key(s0) >= series_key(s1):
            raise MmlabError(f"{name}: a release range goes from older to newer")
        suffix = "" if f0 == "cloud" else f"-{f0}"
        middle = [f"debian:{s}{suffix}" for s in have
                  if series_key(s0) < series_key(s) < series_key(s1)]
        out += [f"debian:{m.group(1)}", *middle, f"debian:{last}"]
    if len(set(map(str, out))) != len(out):
        raise MmlabError(f"{', '.join(map(str, names))}: the expanded kernels repeat one")
    return out
