"""A suite whose kernels name point releases (debian:6.12.43, ...) keeps
each release once in its series, however many of them the store holds."""

from types import SimpleNamespace

from mmlab.track import releases
from mmlab.track.releases import Release

VERSIONS = {"6.12.43": "6.12.43-1~bpo12+1", "6.12.73": "6.12.73-1~bpo12+1",
            "6.12.115": "6.12.115-2", "6.12.118": "6.12.118-1"}


class Exact:
    """A catalog of the point releases above, by their exact names."""

    def exact(self, name: str, label: str | None = None) -> Release:
        return Release(name, VERSIONS[name.removeprefix("debian:")], label or name)


def test_a_stored_point_release_named_by_the_suite_is_not_added_again():
    """The store's cells of 6.12.43..6.12.115 (remembered) were put in the
    series a second time under their series' label, the newest of them as
    a point '6.12' between 6.12.115 and 6.12.118: one cell shown twice."""
    kernels = [f"debian:{v}" for v in VERSIONS]
    suite = SimpleNamespace(kernels=kernels, reference_slot=3, branches=[])
    ref = Exact().exact("debian:6.12.118", "6.12.118")
    stored = [Exact().exact(k) for k in kernels[:3]]
    (line,) = releases.lines(suite, Exact(), ref, stored)
    assert [r.label for r in line.releases] == list(VERSIONS)
    # a stored release the suite no longer names keeps its place, as before
    named = [kernels[0], *kernels[2:]]
    (line,) = releases.lines(SimpleNamespace(kernels=named, reference_slot=2, branches=[]),
                             Exact(), ref, stored)
    assert [r.label for r in line.releases] == ["6.12.43", "6.12", "6.12.115", "6.12.118"]
    assert line.releases[1].name == "debian:6.12.73"
