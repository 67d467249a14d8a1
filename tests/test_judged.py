"""What the tracker and the check follow of a stored experiment beyond its
profile's metrics (track/judged.py): each path's calls and instructions per
call, and its functions' inclusive counts, never the window's own figures
the profile chose among."""

from __future__ import annotations

from types import SimpleNamespace

from mmlab.experiment.plan import parse
from mmlab.track import judged
from mmlab.workloads import EVENTS

from .test_count_rule import PROFILE
from .test_guest_states import _sample


def _followed(figures: dict[str, float]) -> list[str]:
    samples = [_sample(0, "") for _ in range(2)]
    for s in samples:
        s.metrics.update(figures)
    return judged.followed(parse(PROFILE, "p.toml"),
                           SimpleNamespace(trials=[SimpleNamespace(samples=samples)]))


def test_a_windows_own_events_are_not_followed_its_paths_are():
    """A profile that names one event has the counting pass count every
    event of its windows (insns.py); those are the window's own figures,
    which the profile chose among, so none becomes a series of its own,
    while the paths' calls and instructions per call do, and the paths'
    events stay the profile's choice too."""
    figures = {"advise_kernel_insns_per_page": 1e6, "advise_user_insns_per_page": 1e3}
    for side in ("kernel", "user"):
        figures.update({f"advise_{side}_{event}_per_page": 5.0 for event in EVENTS})
    path = "advise_syscall_madvise"
    figures.update({f"{path}_calls": 1.0, f"{path}_kernel_insns_per_call": 2e4,
                    f"{path}_kernel_insns_per_page": 2e4, f"{path}_kernel_ipis_per_call": 1.0,
                    f"{path}_kernel_ipis_per_page": 1.0, "advise_fault_calls": 8.0,
                    "advise_fault_kernel_insns_per_call": 900.0,
                    "advise_fault_kernel_insns_per_page": 7200.0})
    # (madvise's calls are the profile's own metric: judged as one already)
    assert _followed(figures) == ["advise_fault_calls", "advise_fault_kernel_insns_per_call",
                                  f"{path}_kernel_insns_per_call"]


def test_clock_paced_and_unnamed_entries_are_not_followed():
    """Interrupts taken in user mode and entries no symbol names follow
    the host's clock under TCG: not series of their own."""
    figures = {"advise_kernel_insns_per_page": 1e6}
    for stay in ("interrupt", "other", "exception_page_fault"):
        figures.update({f"advise_{stay}_calls": 3.0,
                        f"advise_{stay}_kernel_insns_per_call": 1e4,
                        f"advise_{stay}_kernel_insns_per_page": 3e4})
    assert _followed(figures) == ["advise_exception_page_fault_calls",
                                  "advise_exception_page_fault_kernel_insns_per_call"]
