"""Release-level narrowing: in kernels ordered oldest to newest, find the
first step where a metric changes, testing as few kernels as a binary search
allows.

The search assumes the change, once in, stays in (as `git bisect` does): with
the oldest kernel as the reference, a kernel is "changed" when the verdict
against the oldest is a regression or an improvement, and "unchanged" when it
is no change.  A step whose verdict is unreliable (too noisy to place inside
the tolerance) is still placed when its whole CI lies on one side of the
geometric midpoint between 1 and the end-to-end ratio: a bisection asks which
side of the break a kernel is on, not whether it is within the tolerance.
Each comparison is a real two-kernel experiment, interleaved and judged like
any other; its evidence is kept so the answer can be audited.
"""

from __future__ import annotations

import math
import platform
from collections.abc import Callable
from dataclasses import dataclass

from mmlab.errors import MmlabError
from mmlab.experiment.plan import Plan, with_kernels
from mmlab.judge.comparison import Comparison
from mmlab.judge.criteria import Verdict
from mmlab.kernels import images, specs
from mmlab.kernels.versions import VersionKey, compare_versions, release_upstream, upstream
from mmlab.run import driver, runner
from mmlab.run.events import Created, Event, Message, OnEvent, ignore
from mmlab.store import Store


@dataclass(frozen=True)
class Step:
    kernel: str
    comparison: Comparison
    changed: bool
    why: str


def place(c: Comparison, end_to_end: float | None) -> tuple[bool, str]:
    """(changed?, why) for one step; an error when it cannot be placed."""
    if c.verdict.changed:
        return True, c.verdict
    if c.verdict == Verdict.NO_CHANGE:
        return False, Verdict.NO_CHANGE
    if c.verdict == Verdict.UNRELIABLE and end_to_end and math.isfinite(c.ci_low):
        mid = math.sqrt(end_to_end)
        old_side = (c.ci_low > mid) if end_to_end < 1 else (c.ci_high < mid)
        new_side = (c.ci_high < mid) if end_to_end < 1 else (c.ci_low > mid)
        if old_side or new_side:
            return new_side, (f"unreliable within the tolerance, but its CI [{c.ci_low:.3f}, "
                              f"{c.ci_high:.3f}] lies on the {'new' if new_side else 'old'} side "
                              f"of {mid:.3f}, the midpoint to the end-to-end ratio "
                              f"{end_to_end:.3f}")
    raise MmlabError(f"narrow: {c.arm} vs {c.baseline} is {c.verdict} ({c.reason}); add "
                     "repetitions or fix the state before narrowing")


@dataclass(frozen=True)
class NarrowResult:
    first_changed: int | None      # index into the kernel list, None if nothing changed
    steps: list[Step]

    def lines(self, kernels: list[str], metric: str) -> list[str]:
        """Each tested kernel's placement, then the answer in one line."""
        return ([f"  {s.kernel}: {'changed' if s.changed else 'unchanged'} ({s.why})"
                 for s in self.steps] +
                [f"{metric}: {self.sentence(kernels)} ({len(self.steps)} of "
                 f"{len(kernels) - 1} kernels tested)"])

    def sentence(self, kernels: list[str]) -> str:
        if self.first_changed is None:
            return (f"no change beyond the tolerance between {kernels[0]} and {kernels[-1]}")
        i = self.first_changed
        verdict = next(s.comparison.verdict for s in self.steps if s.kernel == kernels[i])
        return f"{verdict} introduced between {kernels[i - 1]} and {kernels[i]}"


def enough(kernels: list[str], option: str) -> None:
    """Refuse fewer than two kernels, before anything is stored or fetched."""
    if len(kernels) < 2:
        raise MmlabError(f"{option}: narrow needs at least two kernels, got "
                         f"{', '.join(kernels) or 'none'}")


def ordered(names: list[str], say: Callable[[str], None]) -> list[str]:
    """`--kernels` oldest to newest by version, said when that is not the
    order given: a list given newest first would be searched backwards and
    its answer named the wrong way round.  A kernel with no version (a
    local image whose boot header names none), or two of one version (a
    patched and an unpatched build), cannot be ordered and are refused:
    commits are ordered by their tree (--commits)."""
    enough(names, "--kernels")
    cached = {k.name: k for k in images.cached()}
    versions = {name: _version(name, cached.get(name)) for name in names}
    if unknown := [n for n in names if versions[n] is None]:
        raise MmlabError(f"--kernels: cannot order {', '.join(unknown)} oldest to newest: "
                         "no kernel version (narrow builds commit by commit with --source "
                         "TREE --commits OLD..NEW)")
    by = sorted(names, key=lambda n: VersionKey(str(versions[n])))
    for a, b in zip(by, by[1:]):
        if compare_versions(str(versions[a]), str(versions[b])) == 0:
            raise MmlabError(f"--kernels: cannot order {a} and {b}: both are version "
                             f"{versions[a]} (narrow builds commit by commit with --source "
                             "TREE --commits OLD..NEW)")
    if by != names:
        say("narrow: kernels ordered oldest to newest by version: "
            + ", ".join(f"{n} ({versions[n]})" for n in by))
    return by


def _version(name: str, kernel: images.Kernel | None) -> str | None:
    """A kernel's upstream version: a cached one's package version (Debian)
    or release; a Debian one not fetched yet, the catalog entry it would
    fetch; the running kernel's release for the host.  A local or build
    kernel not in the cache is refused, as a run of it would be."""
    if kernel is None and name == "host":
        return release_upstream(platform.release())
    if kernel is None and name.startswith("debian:"):
        return specs.check(name.removeprefix("debian:")).upstream
    try:
        kernel = kernel or images.get(name)
    except MmlabError as exc:
        raise MmlabError(f"--kernels: {exc}") from exc
    return upstream(kernel.package_version) if kernel.package_version \
        else release_upstream(kernel.version)


def bisect(kernels: list[str], compare: Callable[[str, str], Comparison]) -> NarrowResult:
    """`compare(reference, kernel)` runs and judges one pair; the reference is
    always the oldest kernel, so every verdict is against the same baseline."""
    enough(kernels, "narrow")
    ref = kernels[0]
    steps: list[Step] = []

    def changed(i: int) -> bool:
        c = compare(ref, kernels[i])
        end_to_end = steps[0].comparison.ratio if steps else None
        moved, why = place(c, end_to_end)
        steps.append(Step(kernels[i], c, moved, why))
        return moved

    if not changed(len(kernels) - 1):
        return NarrowResult(None, steps)
    lo, hi = 0, len(kernels) - 1          # kernels[lo] unchanged, kernels[hi] changed
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if changed(mid):
            hi = mid
        else:
            lo = mid
    return NarrowResult(hi, steps)


def decisive(comparisons: list[Comparison], metric: str) -> Comparison:
    """One verdict for a metric over all groups (e.g. CPU counts): a change in
    any group counts; otherwise any doubt counts; otherwise no change."""
    mine = [c for c in comparisons if c.metric == metric]
    if not mine:
        raise MmlabError(f"no comparison of {metric} was made")
    for wanted in ((Verdict.REGRESSION, Verdict.IMPROVEMENT),
                   (Verdict.UNRELIABLE, Verdict.NOT_COMPARABLE), (Verdict.NO_CHANGE,)):
        for c in mine:
            if c.verdict in wanted:
                return c
    return mine[0]


def pair_experiment(store: Store, plan: Plan, ref: str, kernel: str, note: str,
                    place: driver.Place, what: str,
                    on_event: OnEvent = ignore) -> tuple[int, runner.RunResult]:
    """The profile on `ref` (the baseline) and `kernel`, interleaved and
    stored as an experiment of its own whose `derived` key starts with
    `note`, run with adaptive looks and the audit's controls: each step of
    a search, and each confirmation of the release tracker.  `what` is
    said, with the experiment's ID, before the first trial."""
    return kernels_experiment(store, plan, [ref, kernel], note, place, what, on_event)


def kernels_experiment(store: Store, plan: Plan, kernels: list[str], note: str,
                       place: driver.Place, what: str,
                       on_event: OnEvent = ignore) -> tuple[int, runner.RunResult]:
    """pair_experiment with more kernels, each against the first: a block
    of the release tracker's cells."""
    def told(event: Event) -> None:
        if isinstance(event, Created):
            event = Message(f"{what} (experiment {event.ids[0]})")
        on_event(event)
    done = driver.run_experiment(store, with_kernels(plan, kernels, note), place,
                                 on_event=told)
    return done.exp_id, done.result


def experiment_step(store: Store, plan: Plan, ref: str, kernel: str, metric: str,
                    place: driver.Place, on_event: OnEvent = ignore) -> Comparison:
    """One comparison of the search, judged on `metric` alone (so that a
    metric only some runs produce, instructions, is produced, and the
    family the runner corrects for is that one metric's)."""
    plan = plan.model_copy(update={"profile": plan.profile.model_copy(
        update={"metrics": [metric]})})
    _, result = pair_experiment(store, plan, ref, kernel, f"narrow {ref}..{kernel}", place,
                                f"narrow: {kernel} against {ref}", on_event)
    return decisive(result.judgement.comparisons, metric)


def search(store: Store, plan: Plan, kernels: list[str], metric: str,
           place: driver.Place, ensure: Callable[[str], None],
           on_event: OnEvent = ignore) -> NarrowResult:
    """bisect over `kernels` with each step a stored two-kernel experiment;
    `ensure(name)` makes a kernel ready first (a commit's build), and
    `on_event` hears the runs and one Message per step as it is decided."""
    def compare(ref: str, kernel: str) -> Comparison:
        ensure(ref)
        ensure(kernel)
        c = experiment_step(store, plan, ref, kernel, metric, place, on_event)
        on_event(Message(f"  {c.arm} vs {c.baseline}: {c.verdict}, ratio {c.ratio:.3f} "
                f"[{c.ci_low:.3f}, {c.ci_high:.3f}], p {c.p_value:.2g} ({c.reason})"))
        return c
    return bisect(kernels, compare)
