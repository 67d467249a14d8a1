"""A tracking suite: which profiles, which metrics, over which kernels, each
measured against one reference kernel.

```toml
name = "seeds"
reference = "debian:6.12"
kernels = "debian:6.1.."          # open-ended: every series the catalog serves now
branches = ["debian:6.12"]        # and every point release of these, a series each
metrics = ["advise_kernel_insns_per_page", "advise_ns_per_page"]
[[profile]]
path = "../seed001-pageout-insns-6.12-6.19.toml"
```

Every profile is read as `experiment run` reads it (its own kernel axis is
replaced by each cell's pair), and every problem is one line naming the key
before anything is measured.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mmlab.errors import MmlabError
from mmlab.experiment import plan as experiment_plan
from mmlab.experiment import source
from mmlab.kernels import catalog, specs


class TrackedProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str                                  # relative to the suite file
    name: str | None = None                    # default: the profile's own name
    area: str | None = None                    # the mm area its changes are listed under in
    #                                            the release notes (default: its workload)


class SuiteFile(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    reference: str                             # the kernel every cell is paired against
    kernels: str | list[str]                   # a range (open-ended allowed) or names
    branches: list[str] = []                   # series whose point releases are tracked too
    # what a branch's cells measure: the suite's metrics, or its instruction
    # counts alone (one counting boot a trial; profiles without counts skip it)
    branch_metrics: Literal["all", "counts"] = "all"
    metrics: list[str] = Field(min_length=1)   # tracked where a profile has them
    profile: list[TrackedProfile] = Field(min_length=1)


class Tracked(BaseModel):
    """One profile of the suite, read: its plan and the suite metrics it has."""
    name: str
    plan: experiment_plan.Plan
    metrics: list[str]
    area: str = ""                  # the release notes' heading for its changes


class Suite(BaseModel):
    name: str
    path: str
    text: str
    reference: str                  # a kernel, or a point release of a series among them
    kernels: list[str]              # release order
    reference_slot: int             # where the reference stands among `kernels`
    branches: list[str]             # debian:6.12: its point releases are a series
    profiles: list[Tracked]
    branch_metrics: str = "all"     # or "counts": a branch's cells count and do not time


def load(path: str | Path) -> Suite:
    """Read and check a suite; the kernel range is expanded against the
    catalog as it is now, so a refreshed catalog brings new releases."""
    path = Path(path)
    text = source.read(path, "suite")
    try:
        raw = SuiteFile.model_validate(tomllib.loads(text))
    except tomllib.TOMLDecodeError as exc:
        raise MmlabError(f"{path}: {exc}") from exc
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise MmlabError(f"{path}: {where}: {err['msg']}") from exc
    kernels = _kernels(path, raw)
    slot = _slot(path, raw.reference, kernels)
    profiles = [_tracked(path, raw, t) for t in raw.profile]
    names = [t.name for t in profiles]
    if len(set(names)) != len(names):
        raise MmlabError(f"{path}: profile: two tracked profiles share a name (give one a name)")
    return Suite(name=raw.name, path=str(path), text=text, reference=raw.reference,
                 kernels=kernels, reference_slot=slot,
                 branches=[_branch(path, b) for b in raw.branches], profiles=profiles,
                 branch_metrics=raw.branch_metrics)


def _kernels(path: Path, raw: SuiteFile) -> list[str]:
    names = [raw.kernels] if isinstance(raw.kernels, str) else raw.kernels
    try:
        kernels = specs.expand(names)
    except MmlabError as exc:
        raise MmlabError(f"{path}: kernels: {exc}") from exc
    return kernels


def _slot(path: Path, reference: str, kernels: list[str]) -> int:
    """The reference's place in the series across releases: itself, or the
    series a pinned point release (debian:6.12.117) belongs to."""
    if reference in kernels:
        return kernels.index(reference)
    m = specs.SPEC.match(reference.removeprefix("debian:"))
    if reference.startswith("debian:") and m and m.group(3):
        series = f"debian:{m.group(1)}.{m.group(2)}" + (f"-{m.group(4)}" if m.group(4) else "")
        if series in kernels:
            return kernels.index(series)
    raise MmlabError(f"{path}: reference: {reference} is not among the suite's kernels "
                     f"({', '.join(kernels)}) nor a point release of one")


def _branch(path: Path, name: str) -> str:
    """A branch is a Debian release series the catalog serves."""
    if not name.startswith("debian:"):
        raise MmlabError(f"{path}: branches: {name}: a branch is a Debian series (debian:6.12)")
    try:
        series, exact, flavour = specs.parse_spec(name.removeprefix("debian:"))
        have = catalog.series_available(None, flavour)
    except MmlabError as exc:
        raise MmlabError(f"{path}: branches: {exc}") from exc
    if exact or series not in have:
        raise MmlabError(f"{path}: branches: {name} is not a release series the Debian catalog "
                         f"has ({', '.join(have)})")
    return name


def _tracked(path: Path, raw: SuiteFile, t: TrackedProfile) -> Tracked:
    where = (path.parent / t.path)
    try:
        plan = experiment_plan.load(where)
    except MmlabError as exc:
        raise MmlabError(f"{path}: profile {t.path}: {exc}") from exc
    have = {m.name for m in plan.workload.metrics}      # and a window's syscalls and faults
    metrics = [m for m in raw.metrics if m in have or plan.workload.stay_metric(m)]
    if not metrics:
        raise MmlabError(f"{path}: profile {t.path}: none of the suite's metrics "
                         f"({', '.join(raw.metrics)}) is a metric of {plan.workload.name}")
    if plan.profile.arms:
        raise MmlabError(f"{path}: profile {t.path}: the tracker needs a [matrix] profile")
    return Tracked(name=t.name or plan.profile.name, plan=plan, metrics=metrics,
                   area=t.area or plan.workload.name)
