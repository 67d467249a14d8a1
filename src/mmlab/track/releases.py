"""The releases a suite's series are made of, resolved against the catalog
as it is now: each kernel the suite names (a series such as debian:6.16,
or a point release) becomes one exact release, the newest package of its
upstream version, booted by its exact name (debian:6.16.12) so the cache,
the cell's key and what the guest runs are the same kernel.

Two kinds of series: *across* (one release per series of the suite's
range, newest point release of each) and one per *branch* the suite names
(every point release of debian:6.12 the catalog serves), so a step that a
stable backport brought is told apart from one a new series brought.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from mmlab.errors import MmlabError
from mmlab.kernels import catalog, images, specs
from mmlab.kernels.versions import VersionKey
from mmlab.track.suite import Suite

ACROSS = "across"


@dataclass(frozen=True)
class Release:
    name: str        # the kernel the arms boot, exact: debian:6.16.12
    version: str     # its package version, 6.16.12-1~bpo13+1: what a cell is keyed by
    label: str       # what its series calls it: 6.16 across series, 6.12.43 in a branch


def branch_kind(series: str) -> str:
    """The kind of a branch's series: debian:6.12 -> '6.12.y'."""
    return f"{series.removeprefix('debian:')}.y"


class Resolver(Protocol):
    """Names -> releases; the tests give one that knows local kernels only."""

    def exact(self, name: str, label: str | None = None) -> Release: ...

    def branch(self, series: str) -> list[Release]: ...

    def prepare(self, release: Release) -> None: ...


def check(resolver: Resolver, suite: Suite) -> None:
    """Every kernel and branch of the suite resolves, before anything is
    stored or measured; one line naming the suite otherwise."""
    try:
        for name in dict.fromkeys([*suite.kernels, suite.reference]):
            resolver.exact(name)
        for b in suite.branches:
            resolver.branch(b)
    except MmlabError as exc:
        raise MmlabError(f"{suite.path}: {exc}") from exc


@dataclass(frozen=True)
class Line:
    """One series: its kind and its releases in release order."""
    kind: str
    releases: list[Release]


def lines(suite: Suite, resolver: Resolver, reference: Release,
          remembered: Sequence[Release] = ()) -> list[Line]:
    """The series across releases (the reference in its slot), then one per
    branch (the reference is the point release it pins, where it is one).
    Debian releases the store has cells of but the catalog no longer serves
    (`remembered`: backports are removed from the archive) keep their place,
    so a series never loses a measured release."""
    across = [replace(reference, label=_label(k)) if i == suite.reference_slot
              else resolver.exact(k, _label(k)) for i, k in enumerate(suite.kernels)]
    debian = [r for r in remembered if r.name.startswith("debian:")]
    across = _merge(across, [replace(r, label=_series(r.name)) for r in debian], inside=True)
    out = [Line(ACROSS, across)]
    for b in suite.branches:
        mine = [replace(r, label=_label(r.name)) for r in debian
                if _series(r.name) == _label(b)]
        out.append(Line(branch_kind(b), _merge(resolver.branch(b), mine, inside=False)))
    return out


def _label(kernel: str) -> str:
    return kernel.removeprefix("debian:")


def _series(name: str) -> str:
    """debian:6.16.12 -> 6.16 (debian:6.16.12-generic -> 6.16-generic)."""
    series, _, flavour = specs.parse_spec(_label(name))
    return series + ("" if flavour == "cloud" else f"-{flavour}")


def _merge(line: list[Release], extra: list[Release], inside: bool) -> list[Release]:
    """`line` with the releases of `extra` whose label it lacks (the newest
    of each label), in version order among its Debian releases; with
    `inside`, only those between its first and last Debian release.  A
    release `line` holds already (a suite naming point releases) is not
    added again under another label."""
    have = {r.label for r in line}
    held = {(r.name, r.version) for r in line}
    newest: dict[str, Release] = {}
    for r in sorted(extra, key=lambda r: VersionKey(r.version)):
        if r.label not in have and (r.name, r.version) not in held:
            newest[r.label] = r
    debian = [VersionKey(r.version) for r in line if r.name.startswith("debian:")]
    out = list(line)
    for r in newest.values():
        key = VersionKey(r.version)
        if inside and not (debian and debian[0] < key < debian[-1]):
            continue
        at = next((i for i, x in enumerate(out) if x.name.startswith("debian:")
                   and key < VersionKey(x.version)), len(out))
        out.insert(at, r)
    return out


class Catalog:
    """Releases from mmlab's Debian catalog; kernels that are not Debian's
    (local:, build:) are their cached image, keyed by its release string."""

    def __init__(self, apt: catalog.Apt | None = None):
        self.apt = apt or catalog.Apt()

    def exact(self, name: str, label: str | None = None) -> Release:
        if not name.startswith("debian:"):
            return Release(name, images.get(name).version, label or name)
        spec = name.removeprefix("debian:")
        e = specs.resolve(spec, self.apt)
        suffix = "" if e.flavour == "cloud" else f"-{e.flavour}"
        return Release(f"debian:{e.upstream}{suffix}", e.package_version, label or spec)

    def branch(self, series: str) -> list[Release]:
        spec = series.removeprefix("debian:")
        name, exact, flavour = specs.parse_spec(spec)
        if exact:
            raise MmlabError(f"{series}: a branch is a release series (debian:6.12), "
                             "not a point release")
        found = sorted({e.upstream for e in catalog.entries(self.apt.catalog())
                        if e.series == name and e.flavour == flavour}, key=VersionKey)
        if not found:
            raise MmlabError(f"{series}: the Debian catalog has no {name} {flavour} kernel "
                             f"(release series it has: "
                             f"{', '.join(catalog.series_available(self.apt, flavour))})")
        suffix = "" if flavour == "cloud" else f"-{flavour}"
        return [self.exact(f"debian:{u}{suffix}", u) for u in found]

    def prepare(self, release: Release) -> None:
        """The cached image of `release` is the package the cell is keyed by:
        fetched when missing, fetched again when the cache holds an older
        package of the same upstream version."""
        if not release.name.startswith("debian:"):
            return
        k = images.ensure(release.name)
        if k.package_version != release.version:
            images.add_debian(release.name.removeprefix("debian:"))
