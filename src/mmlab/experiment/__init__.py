"""Profiles (TOML) -> arms -> a seeded, interleaved schedule of trials.

A profile names a workload, its base parameters, and either a matrix of axes
(the arms are their cartesian product) or an explicit list of arms (an A/A
check is the same arm twice under two names).  An axis is a workload
parameter or a host setting (`thp_mode`, `thp_defrag`, `swap`, `cpus`,
`ksm.<knob>`, `sysctl.<name>`).  The schedule runs every arm once per round,
in an order shuffled by the seed, so slow drift of a noisy machine spreads
over all arms instead of biasing one.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import tomli_w
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from mmlab import workloads
from mmlab.errors import MmlabError
from mmlab.kernels import specs
from mmlab.machine import knobs
from mmlab.names import axis_text
from mmlab.workloads import execwork

KERNEL_NAME = re.compile(r"^(host|debian:\d+\.\d+(\.\d+)?(-generic)?"
                         r"|(local|build):[A-Za-z0-9._+-]+)$")
Scalar = str | int | float | bool
CPU_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


def _kernel_name(value: str) -> str:
    if not KERNEL_NAME.match(value):
        raise ValueError("expected host, debian:MAJOR.MINOR[.PATCH][-generic], local:NAME or "
                         "build:NAME (a release range debian:X.Y..debian:X.Y only in a matrix)")
    return value


def _cpu_spec(value: object) -> str:
    """A vCPU or CPU count (2) or, on the host, a CPU list ("0-1,3")."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
            or isinstance(value, str) and CPU_LIST.match(value):
        return str(value)
    raise ValueError('expected a CPU count like 2 or, on the host, a CPU list like "0-1,3"')


KernelName = Annotated[str, AfterValidator(_kernel_name)]
CpuSpec = Annotated[Any, AfterValidator(_cpu_spec)]


# Every model a profile is read into refuses inf and NaN: a value that cannot
# be stored as JSON would make the stored experiment unreadable.
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


class ArmEntry(BaseModel):
    """One explicit arm: a name and what it sets on top of the base."""
    model_config = STRICT
    name: str = Field(min_length=1)
    set: dict[str, Scalar] = {}


class Profile(BaseModel):
    model_config = STRICT

    name: str = Field(min_length=1)
    description: str = ""
    derived: str = ""             # set by ab and narrow: what this profile was derived from
    workload: str
    kernel: KernelName = "host"   # or debian:6.12, local:NAME: a guest in QEMU
    memory_mb: int = Field(default=1024, ge=128)
    timeout_s: float = Field(default=600, gt=0, description="per guest trial; per exec command")
    cmdline: str = ""             # added to a guest kernel's command line
    attribute: bool = False       # attribution trials after the timing trials
    focus: str | None = None      # explain/report: only stacks through this function
    trace_count: list[str] = []   # guests: functions to count (default: the mm paths)
    trace_time: list[str] = []    # guests: functions to time (default: the first mm path)
    # workload = "exec" (execwork.py): a command or a C file, measured from outside
    command: list[str] | str = []    # {axis} substituted; {out}: a file mmwork makes and reads
    source: str | None = None        # a C reproducer (relative to the profile), built -static
    metrics_from: execwork.MetricsFrom | None = None
    exec_metrics: dict[str, execwork.ExecMetric | execwork.Direction] = {}
    smaps: bool = False              # the command's smaps at its exit
    params: dict[str, Scalar] = {}
    matrix: dict[str, Annotated[list[Scalar], Field(min_length=1)]] = {}
    arms: list[ArmEntry] = []
    repetitions: int = Field(ge=1, description="rounds before the first look: the minimum; "
                             "3 or more where arms are compared (one arm: `mmlab run`)")
    max_repetitions: int | None = Field(default=None, ge=3, description="rounds at most; "
                                        "None: repetitions (one look, no rounds added)")
    budget_s: float | None = Field(default=None, gt=0, description="no rounds are added once "
                                   "the finished trials took this long")
    warmups: int | None = Field(default=None, ge=0)
    samples_per_trial: int = Field(default=1, ge=1)
    min_sample_ms: int | None = Field(default=None, ge=0)
    metrics: list[str] = Field(min_length=1)
    baseline: str | dict[str, Scalar]
    tolerance: float = Field(default=0.05, gt=0, lt=1)
    max_cv: float = Field(default=0.10, gt=0)
    alpha: float = Field(default=0.05, gt=0, lt=1)       # false alarms, family and looks
    confidence: float = Field(default=0.90, gt=0.5, lt=1)  # the interval; "no change" test
    correction: Literal["holm", "none"] = "holm"
    seed: int = 1
    host_changes: bool = False

    @field_validator("max_repetitions")
    @classmethod
    def max_not_below_min(cls, value: int | None, info: ValidationInfo) -> int | None:
        least = info.data.get("repetitions")
        if value is not None and least is not None and value < least:
            raise ValueError(f"{value} is below repetitions = {least} (the minimum)")
        return value

    @property
    def rounds_at_most(self) -> int:
        return self.max_repetitions or self.repetitions

    @field_validator("matrix")
    @classmethod
    def axes_not_empty(cls, m: dict[str, list[Scalar]]) -> dict[str, list[Scalar]]:
        for axis, values in m.items():
            if len(set(map(str, values))) != len(values):
                raise ValueError(f"axis '{axis}' repeats a value")
        return m


class SettingAxes(BaseModel):
    """The axes that are settings rather than workload parameters, typed: a
    bad value is refused here with the axis named.  `ksm.<knob>` and
    `sysctl.<name>` axes arrive as the `ksm` and `sysctl` tables."""
    model_config = STRICT

    thp_mode: knobs.ThpMode | None = None
    thp_defrag: knobs.ThpDefragMode | None = None
    swap: knobs.SwapSpec | None = None
    cpus: CpuSpec | None = None
    kernel: KernelName | None = None
    memory_mb: Annotated[StrictInt, Field(ge=128)] | None = None
    numa_nodes: Annotated[StrictInt, Field(ge=1, le=8)] | None = None   # guests only
    damon: Literal["off"] | None = None   # every DAMON actor stopped (knobs.DamonActors)
    ksm: dict[str, StrictInt] = {}
    sysctl: dict[str, Scalar] = {}

    @classmethod
    def split(cls, values: dict[str, Scalar]) -> tuple[dict[str, Any], dict[str, Scalar]]:
        """(setting axes as this model's input, workload parameters)."""
        settings: dict[str, Any] = {"ksm": {}, "sysctl": {}}
        params: dict[str, Scalar] = {}
        for axis, value in values.items():
            table, dot, knob = axis.partition(".")
            if dot and table in ("ksm", "sysctl"):
                settings[table][knob] = value
            elif axis in cls.model_fields:
                settings[axis] = value
            else:
                params[axis] = value
        return settings, params


class Arm(BaseModel):
    """One arm of the plan, everything a target needs to run its trials."""
    model_config = ConfigDict(frozen=True)

    name: str
    values: dict[str, Scalar]          # the axis values that define it
    params: dict[str, Scalar]          # workload parameters, base + arm
    settings: knobs.HostSettings = knobs.HostSettings()
    cpus: str | None = None            # host: a CPU list to pin to; guest: the vCPU count
    kernel: str = "host"
    memory_mb: int = 1024
    numa_nodes: int = 1                # guests: NUMA nodes (QEMU -numa)
    control_of: str | None = None      # a matched-state control of this arm (controls.py)
    control: str | None = None         # the state it forces, e.g. "thp=nohugepage"

    @property
    def target(self) -> str:
        """Where its trials run: "host" or "qemu:<kernel>"."""
        return "host" if self.kernel == "host" else f"qemu:{self.kernel}"


class Plan(BaseModel):
    """A validated profile expanded into arms and a schedule, with the
    workload's table as it was at planning time.  It is stored whole, so
    reading an experiment back never needs the profile parser or mmwork."""

    profile: Profile
    text: str
    path: str
    workload: execwork.AnyWorkload
    arms: list[Arm]
    order: list[tuple[int, str]] = []   # (round, arm name)
    machine: str | None = None          # a fleet machine whose worker runs the trials
    fleet: str | None = None            # the fleet run its machines' experiments share

    @property
    def profile_hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)

    def smallest_p(self) -> float:
        """The smallest two-sided p the most rounds this profile may run can
        give: each trial is one observation, so with n rounds it is the smaller
        of Wilcoxon signed-rank's 2 / 2^n (paired) and Mann-Whitney's
        2 / C(2n, n) (unpaired): 0.1 for n = 3."""
        n = self.profile.rounds_at_most
        return min(1.0, 2 / 2 ** n, 2 / math.comb(2 * n, n))

    def warnings(self) -> list[str]:
        p = self.smallest_p()
        if p >= self.profile.alpha:
            n = self.profile.rounds_at_most
            return [f"{self.path}: with at most {n} rounds the smallest possible p is "
                    f"{p:.3g} >= alpha {self.profile.alpha}: this profile can show 'no change' "
                    "but never a significant regression or improvement (use 4 or more)"]
        return []


# ---------------------------------------------------------------- errors with lines

def _key_lines(text: str) -> dict[str, int]:
    """'matrix.thp' -> the line it stands on, for error messages."""
    lines: dict[str, int] = {}
    table = ""
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        header = re.fullmatch(r"\[\[?\s*([^\]]+?)\s*\]\]?", line)
        if header:
            table = header.group(1).replace('"', "")
            lines.setdefault(table, no)
            continue
        key = re.match(r'("[^"]+"|[A-Za-z0-9_.-]+)\s*=', line)
        if key:
            name = key.group(1).strip('"')
            lines.setdefault(f"{table}.{name}" if table else name, no)
    return lines


def _where(path: str, text: str, loc: tuple) -> str:
    parts = [str(p) for p in loc if not isinstance(p, int)]
    lines = _key_lines(text)
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in lines:
            return f"{path}:{lines[key]}: {'.'.join(parts)}"
    return f"{path}: {'.'.join(parts) or '(top level)'}"


# ---------------------------------------------------------------- loading

def load(path: str | Path) -> Plan:
    """Read, validate and expand a profile; every error names file, line and
    key.  Only a regular file of UTF-8 text is read (a FIFO would hang)."""
    path = Path(path)
    if not path.is_file():
        raise MmlabError(f"{path}: " + ("not a regular file" if path.exists()
                                        else "no such profile"))
    try:
        text = path.read_text()
    except OSError as exc:
        raise MmlabError(f"{path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise MmlabError(f"{path}: not a TOML profile (not UTF-8 text at byte {exc.start})") \
            from exc
    return parse(text, str(path))


def parse(text: str, path: str = "<profile>") -> Plan:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MmlabError(f"{path}: {exc}") from exc
    try:
        profile = Profile.model_validate(raw)
    except ValidationError as exc:
        raise MmlabError(f"{_where(path, text, exc.errors()[0]['loc'])}: "
                         f"{_message(exc)}") from exc
    return build(profile, text, path)


def _message(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return "unknown key" if err["type"] == "extra_forbidden" else \
        err["msg"].removeprefix("Value error, ")


def build(profile: Profile, text: str, path: str) -> Plan:
    """Expand a validated profile into its arms and schedule.  Each arm's
    parameters are checked by mmwork itself, once, here."""
    def fail(loc: tuple, msg: str) -> MmlabError:
        return MmlabError(f"{_where(path, text, loc)}: {msg}")

    wl = _workload(profile, path, fail)
    for i, metric in enumerate(profile.metrics):
        try:
            wl.metric(metric)
        except MmlabError as exc:
            raise fail(("metrics", i), str(exc).removeprefix(f"{wl.name}: ")) from exc
    if bool(profile.matrix) == bool(profile.arms):
        raise fail(("matrix",), "give either a non-empty [matrix] or [[arms]], not both or neither")

    if any(isinstance(v, str) and ".." in v for v in profile.matrix.get("kernel", [])):
        try:   # a release range: one kernel per release series the catalog has
            expanded = specs.expand(profile.matrix["kernel"])
        except MmlabError as exc:
            raise fail(("matrix", "kernel"), str(exc)) from exc
        profile = profile.model_copy(update={"matrix": {**profile.matrix, "kernel": expanded}})
    base = dict(profile.params)
    if profile.min_sample_ms is not None:
        base.update(_sample_length(wl, profile.min_sample_ms, fail))
    arms = _expand(profile, wl, base, fail)
    if len(arms) > 1 and profile.repetitions < MIN_ROUNDS:
        raise fail(("repetitions",), f"{profile.repetitions}: arms are compared from "
                   f"{MIN_ROUNDS} rounds on")
    _check_baseline(profile, arms, fail)
    return Plan(profile=profile, text=text, path=path, workload=wl, arms=arms,
                order=schedule([a.name for a in arms], profile.repetitions, profile.seed))


MIN_ROUNDS = 3      # a comparison's least rounds: fewer cannot give a verdict
MIN_NODE_MB = 128   # a guest NUMA node's least memory: smaller nodes fail to boot
EXEC_KEYS = ("command", "source", "metrics_from", "exec_metrics", "smaps")


def _workload(profile: Profile, path: str, fail) -> workloads.Workload:
    """The profile's workload: mmwork's by name, or an exec workload built
    from the exec keys, which only it may use."""
    if profile.workload != "exec":
        for key in EXEC_KEYS:
            if key in profile.model_fields_set:
                raise fail((key,), 'only for workload = "exec"')
        try:
            return workloads.get(profile.workload)
        except MmlabError as exc:
            raise fail(("workload",), f"{exc}; exec runs a command") from exc
    try:
        return execwork.build(profile.command, source=profile.source, base=Path(path).parent,
                              metrics_from=profile.metrics_from, declared=profile.exec_metrics,
                              smaps=profile.smaps, timeout_s=profile.timeout_s)
    except execwork.ProfileKeyError as exc:
        raise fail(tuple(exc.key.split(".")), str(exc)) from exc


def _sample_length(wl: workloads.Workload, ms: int, fail) -> dict[str, Scalar]:
    names = {p.name for p in wl.params}
    if "min-ms" in names:
        return {"min-ms": ms}
    if "seconds" in names:
        return {"seconds": ms / 1000}
    raise fail(("min_sample_ms",), f"{wl.name} has no sample-length parameter")


def _arm(name: str, values: dict[str, Scalar], base: dict[str, Scalar],
         wl: workloads.Workload, loc: tuple, fail, profile: Profile) -> Arm:
    raw, params = SettingAxes.split(values)
    try:
        axes = SettingAxes.model_validate(raw)
    except ValidationError as exc:
        axis = ".".join(map(str, exc.errors()[0]["loc"][:2]))
        raise fail(loc + (axis,), f"{values.get(axis)!r}: {_message(exc)}") from exc
    params = {**base, **params}
    try:
        wl.check(params)
    except MmlabError as exc:
        raise fail(loc, str(exc)) from exc
    kernel = axes.kernel or profile.kernel
    cpus = axes.cpus
    if kernel != "host" and cpus is not None and not cpus.isdigit():
        raise fail(loc + ("cpus",), f"{cpus!r}: a guest takes a vCPU count, not a CPU list")
    if kernel == "host" and axes.numa_nodes not in (None, 1):
        raise fail(loc + ("numa_nodes",), f"{axes.numa_nodes!r}: NUMA nodes are made for guests "
                   "(QEMU -numa); the host has the nodes it has")
    memory_mb = axes.memory_mb or profile.memory_mb
    nodes = axes.numa_nodes or 1
    if memory_mb < nodes * MIN_NODE_MB:
        raise fail(loc + ("numa_nodes",), f"{nodes} NUMA nodes in {memory_mb} MiB: a guest "
                   f"node needs {MIN_NODE_MB} MiB or more (raise memory_mb)")
    settings = knobs.HostSettings(thp=axes.thp_mode, thp_defrag=axes.thp_defrag, swap=axes.swap,
                                  ksm=axes.ksm, sysctl={k: axis_text(v) for k, v in axes.sysctl.items()},
                                  damon=axes.damon)
    return Arm(name=name, values=values, params=params, settings=settings, cpus=cpus,
               kernel=kernel, memory_mb=memory_mb, numa_nodes=nodes)


def _expand(profile: Profile, wl: workloads.Workload, base: dict[str, Scalar], fail) -> list[Arm]:
    if profile.arms:
        names = [a.name for a in profile.arms]
        if len(set(names)) != len(names):
            raise fail(("arms",), "two arms share a name")
        return [_arm(a.name, dict(a.set), base, wl, ("arms", "set"), fail, profile)
                for a in profile.arms]
    axes = list(profile.matrix)
    arms = []
    for combo in itertools.product(*(profile.matrix[a] for a in axes)):
        values = dict(zip(axes, combo))
        name = ",".join(f"{a}={axis_text(v)}" for a, v in values.items())
        arms.append(_arm(name, values, base, wl, ("matrix",), fail, profile))
    return arms



def _check_baseline(profile: Profile, arms: list[Arm], fail) -> None:
    if isinstance(profile.baseline, str):
        if profile.baseline not in {a.name for a in arms}:
            raise fail(("baseline",), f"no arm is named {profile.baseline!r} (arms: "
                       f"{', '.join(a.name for a in arms)})")
        return
    for axis, value in profile.baseline.items():
        if axis not in profile.matrix:
            raise fail(("baseline", axis), f"'{axis}' is not a matrix axis")
        if axis_text(value) not in map(axis_text, profile.matrix[axis]):
            raise fail(("baseline", axis), f"{value!r} is not a value of axis '{axis}'")


def baseline_for(plan: Plan, arm: Arm) -> Arm | None:
    """The arm `arm` is judged against (None for a baseline itself).

    A string baseline names one arm.  A table baseline ({thp = "nohugepage"})
    pairs each arm with the arm that shares all its other axis values, so a
    two-axis matrix gives one comparison per value of the other axis.
    A matched-state control is judged against the control of its arm's
    baseline that forces the same state.
    """
    if arm.control_of is not None:
        base_arm = baseline_for(plan, plan.arm(arm.control_of))
        return None if base_arm is None else next(
            (a for a in plan.arms if a.control_of == base_arm.name and a.control == arm.control),
            None)
    base = plan.profile.baseline
    arms = [a for a in plan.arms if a.control_of is None]
    if isinstance(base, str):
        return None if arm.name == base else next(a for a in arms if a.name == base)
    want = {**arm.values, **base}
    if all(axis_text(arm.values[k]) == axis_text(v) for k, v in base.items()):
        return None
    return next((a for a in arms
                 if all(axis_text(a.values[k]) == axis_text(v) for k, v in want.items())), None)


def schedule(arm_names: list[str], repetitions: int, seed: int,
             start: int = 0) -> list[tuple[int, str]]:
    """Every arm once per round, each round shuffled by the seed: reproducible.
    Rounds `start`..`repetitions`-1 of the same sequence are the rounds an
    adaptive run adds, so a plan extended look by look is the plan that would
    have been drawn whole."""
    rng = random.Random(seed)
    order = []
    for rnd in range(repetitions):
        names = list(arm_names)
        rng.shuffle(names)
        if rnd >= start:
            order += [(rnd, n) for n in names]
    return order


def with_limits(plan: Plan, max_repetitions: int | None = None,
                budget_s: float | None = None) -> Plan:
    """The plan with the maximum rounds or the time budget overridden (command
    line), validated like the profile's own keys."""
    update = {k: v for k, v in (("max_repetitions", max_repetitions), ("budget_s", budget_s))
              if v is not None}
    if not update:
        return plan
    try:
        profile = Profile.model_validate({**plan.profile.model_dump(), **update})
    except ValidationError as exc:
        raise MmlabError(f"{plan.path}: {_message(exc)}") from exc
    return plan.model_copy(update={"profile": profile})


# ---------------------------------------------------------------- derived profiles

def with_kernels(plan: Plan, kernels: list[str], note: str) -> Plan:
    """The same profile with `kernel` as an axis over `kernels` and the first of
    them as the baseline: the experiment narrow and ab run.  Its `derived`
    key says why and from which profile (its path and hash); its text, the
    derived profile as TOML, is what the store and the bundle keep, and runs
    again as it is."""
    if plan.profile.arms:
        raise MmlabError(f"{plan.path}: kernel comparisons need a [matrix] profile, not [[arms]]")
    matrix = {"kernel": kernels, **{k: v for k, v in plan.profile.matrix.items() if k != "kernel"}}
    source = hashlib.sha256(plan.text.encode()).hexdigest()[:16]
    derived = plan.profile.model_copy(update={
        "kernel": "host", "matrix": matrix, "baseline": {"kernel": kernels[0]},
        "derived": f"{note}; derived from {plan.path} (sha256 {source})"})
    body = tomli_w.dumps(derived.model_dump(exclude_none=True, exclude_defaults=True))
    return build(derived, body, plan.path)
