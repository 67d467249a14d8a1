"""The narrowing search on recorded verdicts: few comparisons, the right step."""

from __future__ import annotations

import math

import pytest

from mmlab.errors import MmlabError
from mmlab.experiment.plan import load, parse, with_kernels
from mmlab.judge.comparison import Comparison
from mmlab.run import narrow


def verdict(v: str, ratio: float = 1.0, lo: float = math.nan, hi: float = math.nan) -> Comparison:
    nan = math.nan
    return Comparison("m_ns", "b", "a", 9, 9, nan, nan, ratio, lo, hi, nan, nan, nan, nan, nan,
                      v, "recorded")


def recorded(first_changed: int | None, n: int):
    calls = []

    def compare(ref: str, kernel: str) -> Comparison:
        calls.append(kernel)
        i = int(kernel[1:])
        return verdict("regression" if first_changed is not None and i >= first_changed
                       else "no change")
    return compare, calls


@pytest.mark.parametrize("n, first", [(2, 1), (8, 1), (8, 5), (8, 7), (16, 9), (33, 20)])
def test_the_first_changed_kernel_is_found_in_log2_steps(n, first):
    kernels = [f"k{i}" for i in range(n)]
    compare, calls = recorded(first, n)
    result = narrow.bisect(kernels, compare)
    assert result.first_changed == first
    assert len(calls) <= 1 + math.ceil(math.log2(n - 1)) if n > 2 else len(calls) == 1
    assert result.sentence(kernels) == f"regression introduced between k{first - 1} and k{first}"


def test_nothing_changed_costs_one_comparison():
    kernels = [f"k{i}" for i in range(10)]
    compare, calls = recorded(None, 10)
    result = narrow.bisect(kernels, compare)
    assert result.first_changed is None and calls == ["k9"]
    assert "no change" in result.sentence(kernels)


def test_an_unplaceable_step_stops_the_search_with_a_reason():
    with pytest.raises(MmlabError, match="b vs a is unreliable"):
        narrow.bisect(["k0", "k1", "k2", "k3"], lambda ref, k: verdict("unreliable"))
    with pytest.raises(MmlabError, match="b vs a is not comparable"):
        narrow.bisect(["k0", "k1"], lambda ref, k: verdict("not comparable"))
    with pytest.raises(MmlabError, match="at least two kernels"):
        narrow.bisect(["k0"], lambda ref, k: verdict("no change"))


def test_a_change_in_any_group_decides():
    cs = [verdict("no change"), verdict("regression"), verdict("unreliable")]
    assert narrow.decisive(cs, "m_ns").verdict == "regression"
    assert narrow.decisive(cs[::2], "m_ns").verdict == "unreliable"


def test_derived_profiles_round_trip_through_toml():
    plan = load("experiments/pageout-thp-modes.toml")
    derived = with_kernels(plan, ["debian:6.1", "debian:6.12"], "narrow")
    assert derived.profile.baseline == {"kernel": "debian:6.1"}
    assert len(derived.arms) == 6 and derived.profile.focus == "do_madvise"
    again = parse(derived.text, derived.path)
    assert [a.name for a in again.arms] == [a.name for a in derived.arms]


def test_a_noisy_step_is_placed_by_the_side_of_the_break_its_ci_is_on():
    """End to end the metric fell to 0.076; a step at 0.999 [0.92, 1.10] is
    too noisy for 'no change' within 10 % but plainly on the old side."""
    recorded = {"k1": verdict("unreliable", 0.999, 0.924, 1.103),
                "k2": verdict("improvement", 0.076, 0.038, 0.078)}
    result = narrow.bisect(["k0", "k1", "k2"], lambda ref, k: recorded[k])
    assert result.first_changed == 2
    assert "old side of 0.276" in result.steps[1].why
    across = {"k1": verdict("unreliable", 0.3, 0.1, 0.9), "k2": recorded["k2"]}
    with pytest.raises(MmlabError, match="is unreliable"):
        narrow.bisect(["k0", "k1", "k2"], lambda ref, k: across[k])


# ---------------------------------------------------------------- release ranges

FAKE_CATALOG = [
    {"package": "linux-image-6.1.0-56-cloud-amd64-unsigned", "version": "6.1.192-2",
     "suite": "bookworm-security"},
    {"package": "linux-image-6.12.117+deb13-cloud-amd64-unsigned", "version": "6.12.117-1",
     "suite": "trixie"},
    {"package": "linux-image-6.12-cloud-amd64", "version": "6.12.117-1", "suite": "trixie"},
    {"package": "linux-image-6.18.15+deb13-cloud-amd64", "version": "6.18.15-1~bpo13+1",
     "suite": "trixie-backports"},
    {"package": "linux-image-6.19.14+deb13-cloud-amd64", "version": "6.19.14-1~bpo13+1",
     "suite": "trixie-backports"},
    {"package": "linux-binary-6.19.14+deb13-cloud-amd64", "version": "6.19.14-1~bpo13+1",
     "suite": "trixie-backports"},
    {"package": "linux-binary-7.2.13+deb14-cloud-amd64", "version": "7.2.13-1", "suite": "sid"},
    {"package": "linux-binary-7.3-cloud-amd64", "version": "7.3~rc7-1~exp1",
     "suite": "experimental"},
    {"package": "linux-binary-7.3.4+deb13-cloud-amd64", "version": "7.3.4-1~bpo13+1",
     "suite": "trixie-backports"},
    {"package": "linux-image-7.3.4+deb13-amd64", "version": "7.3.4-1~bpo13+1",
     "suite": "trixie-backports"},
    {"package": "linux-binary-7.3.4+deb13-amd64", "version": "7.3.4-1~bpo13+1",
     "suite": "trixie-backports"},
]


@pytest.fixture
def specs(monkeypatch):
    """A recorded catalog instead of the registry: no network, no apt."""
    from mmlab.kernels import catalog, specs
    monkeypatch.setattr(catalog.Apt, "catalog", lambda self: FAKE_CATALOG)
    return specs


def test_a_release_range_is_one_kernel_per_series_the_catalog_has(specs):
    assert specs.expand(["debian:6.12..debian:7.3"]) == [
        "debian:6.12", "debian:6.18", "debian:6.19", "debian:7.2", "debian:7.3"]
    assert specs.expand(["host", "debian:6.1.192..debian:6.19"]) == [
        "host", "debian:6.1.192", "debian:6.12", "debian:6.18", "debian:6.19"]
    assert specs.expand(["debian:6.12", "local:x"]) == ["debian:6.12", "local:x"]


@pytest.mark.parametrize("bad, why", [
    ("debian:7.3..debian:6.12", "from older to newer"),
    ("debian:6.12..debian:9.9", r"9\.9 is not a release series the Debian catalog has"),
    ("debian:6.12..debian:7.3-generic", "same flavour"),
    ("debian:6.12..local:x", "a release range is debian:X.Y..debian:X.Y"),
])
def test_bad_release_ranges_are_one_line_errors(specs, bad, why):
    with pytest.raises(MmlabError, match=why) as exc:
        specs.expand([bad])
    assert "\n" not in str(exc.value)


def test_resolution_takes_the_newest_package_of_either_packaging(specs):
    e = specs.resolve("7.3")
    assert (e.upstream, e.suite, e.packaging) == ("7.3.4", "trixie-backports", "split")
    assert e.packages[0] == "linux-binary-7.3.4+deb13-cloud-amd64"      # not the rc, not the meta
    assert specs.resolve("6.19").packaging == "split"
    assert specs.resolve("6.18").packaging == "signed"
    old = specs.resolve("6.12")
    assert old.packaging == "unsigned" and old.packages == (
        "linux-image-6.12.117+deb13-cloud-amd64-unsigned",)             # not the series meta
    assert specs.resolve("7.3-generic").flavour == "generic"
    assert specs.resolve("6.1.192").suite == "bookworm-security"
    with pytest.raises(MmlabError, match=r"no 6\.12\.5 cloud kernel"):
        specs.resolve("6.12.5")


def test_debian_versions_compare_as_dpkg_does():
    from mmlab.kernels.versions import compare_versions as cmp
    assert cmp("7.3~rc7-1~exp1", "7.3.4-1~bpo13+1") < 0
    assert cmp("6.12.117-1", "6.12.117-1~deb12u1") > 0
    assert cmp("6.12.100-1", "6.12.99-1") > 0
    assert cmp("1:1.0-1", "2.0-1") > 0 and cmp("6.1.192-2", "6.1.192-2") == 0


def test_a_profile_kernel_axis_takes_a_release_range(specs):
    plan = parse("""
name = "range"
workload = "pageout-refault"
repetitions = 3
metrics = ["advise_ns_per_page"]
baseline = { kernel = "debian:6.12" }
[matrix]
kernel = ["debian:6.12..debian:7.3"]
""")
    assert [a.kernel for a in plan.arms] == ["debian:6.12", "debian:6.18", "debian:6.19",
                                             "debian:7.2", "debian:7.3"]
    assert plan.profile.matrix["kernel"][-1] == "debian:7.3"       # stored expanded
    with pytest.raises(MmlabError, match=r"<profile>:\d+: matrix\.kernel: .*9\.9 is not"):
        parse(plan.text.replace("debian:7.3\"]", "debian:9.9\"]"))
    with pytest.raises(MmlabError, match="a release range debian:X.Y..debian:X.Y only in a "
                                         "matrix"):
        parse(plan.text.replace('baseline = { kernel = "debian:6.12" }',
                                'baseline = { cpus = 1 }\n'
                                'kernel = "debian:6.12..debian:7.3"')
              .replace('kernel = ["debian:6.12..debian:7.3"]', "cpus = [1, 2]"))


def test_narrow_takes_a_release_range(tmp_path):
    """The CLI expands --kernels with the real catalog before the search; a
    bad range is one line."""
    from tests.conftest import mmlab
    proc = mmlab("narrow", "experiments/pageout-kernels-cpus.toml", "--kernels",
                 "debian:6.12..debian:9.9", "--results", str(tmp_path / "r"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "is not a release series" in proc.stderr
