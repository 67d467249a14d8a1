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
import json
import math
import random
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import knobs, workloads
from .errors import MmlabError

SETTING_AXES = ("thp_mode", "thp_defrag", "swap", "cpus", "kernel", "memory_mb")
KERNEL_NAME = re.compile(r"^(host|debian:\d+\.\d+(\.\d+)?|(local|build):[A-Za-z0-9._+-]+)$")
SETTING_PREFIXES = ("ksm.", "sysctl.")
Scalar = str | int | float | bool


class ArmEntry(BaseModel):
    """One explicit arm: a name and what it sets on top of the base."""
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    set: dict[str, Scalar] = {}


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    description: str = ""
    workload: str
    kernel: str = "host"          # or debian:6.12, local:NAME: a guest in QEMU
    memory_mb: int = Field(default=1024, ge=128)
    timeout_s: float = Field(default=600, gt=0, description="per guest trial")
    cmdline: str = ""             # added to a guest kernel's command line
    attribute: bool = False       # attribution trials after the timing trials
    focus: str | None = None      # explain/report: only stacks through this function
    trace_count: list[str] = []   # guests: functions to count (default: the mm paths)
    trace_time: list[str] = []    # guests: functions to time (default: the first mm path)
    params: dict[str, Scalar] = {}
    matrix: dict[str, Annotated[list[Scalar], Field(min_length=1)]] = {}
    arms: list[ArmEntry] = []
    repetitions: int = Field(ge=3, description="trials per arm")
    warmups: int | None = Field(default=None, ge=0)
    samples_per_trial: int = Field(default=1, ge=1)
    min_sample_ms: int | None = Field(default=None, ge=0)
    metrics: list[str] = Field(min_length=1)
    baseline: str | dict[str, Scalar]
    tolerance: float = Field(default=0.05, gt=0, lt=1)
    max_cv: float = Field(default=0.10, gt=0)
    alpha: float = Field(default=0.05, gt=0, lt=1)
    seed: int = 1
    host_changes: bool = False

    @field_validator("kernel")
    @classmethod
    def kernel_name(cls, v: str) -> str:
        if not KERNEL_NAME.match(v):
            raise ValueError(f"{v!r}: expected host, debian:MAJOR.MINOR[.PATCH], local:NAME "
                             "or build:NAME")
        return v

    @field_validator("matrix")
    @classmethod
    def axes_not_empty(cls, m: dict[str, list[Scalar]]) -> dict[str, list[Scalar]]:
        for axis, values in m.items():
            if len(set(map(str, values))) != len(values):
                raise ValueError(f"axis '{axis}' repeats a value")
        return m


@dataclass(frozen=True)
class Arm:
    name: str
    values: dict[str, Scalar]          # the axis values that define it
    params: dict[str, Scalar]          # workload parameters, base + arm
    settings: knobs.HostSettings
    cpus: str | None = None            # host: a CPU list to pin to; guest: the vCPU count
    kernel: str = "host"
    memory_mb: int = 1024

    @property
    def is_guest(self) -> bool:
        return self.kernel != "host"

    def spec(self) -> dict[str, Any]:
        return {"values": self.values, "params": self.params, "cpus": self.cpus,
                "kernel": self.kernel, "memory_mb": self.memory_mb,
                "settings": {"thp": self.settings.thp, "thp_defrag": self.settings.thp_defrag,
                             "swap": self.settings.swap, "ksm": self.settings.ksm,
                             "sysctl": self.settings.sysctl}}


@dataclass
class Plan:
    profile: Profile
    text: str
    path: str
    arms: list[Arm]
    order: list[tuple[int, str]] = field(default_factory=list)   # (round, arm name)

    @property
    def profile_hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def smallest_p(self) -> float:
        """The smallest two-sided Mann-Whitney p two arms of this size can reach:
        2 / C(2n, n) with n samples each (0.1 for n = 3)."""
        n = self.profile.repetitions * self.profile.samples_per_trial
        return min(1.0, 2 / math.comb(2 * n, n))

    def warnings(self) -> list[str]:
        p = self.smallest_p()
        if p >= self.profile.alpha:
            n = self.profile.repetitions * self.profile.samples_per_trial
            return [f"{self.path}: with {n} samples per arm the smallest possible p is "
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
    """Read, validate and expand a profile; every error names file, line and key."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise MmlabError(f"{path}: {exc.strerror}") from exc
    return parse(text, str(path))


def parse(text: str, path: str = "<profile>") -> Plan:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MmlabError(f"{path}: {exc}") from exc
    try:
        profile = Profile.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        raise MmlabError(f"{_where(path, text, err['loc'])}: {msg}") from exc

    def fail(loc: tuple, msg: str) -> MmlabError:
        return MmlabError(f"{_where(path, text, loc)}: {msg}")

    try:
        wl = workloads.get(profile.workload)
    except MmlabError as exc:
        raise fail(("workload",), str(exc)) from exc
    for i, metric in enumerate(profile.metrics):
        try:
            wl.metric(metric)
        except MmlabError as exc:
            raise fail(("metrics", i), str(exc).removeprefix(f"{wl.name}: ")) from exc
    if bool(profile.matrix) == bool(profile.arms):
        raise fail(("matrix",), "give either a non-empty [matrix] or [[arms]], not both or neither")

    base = dict(profile.params)
    if profile.min_sample_ms is not None:
        base.update(_sample_length(wl, profile.min_sample_ms, fail))
    arms = _expand(profile, wl, base, fail)
    _check_baseline(profile, arms, fail)
    plan = Plan(profile=profile, text=text, path=path, arms=arms)
    plan.order = schedule([a.name for a in arms], profile.repetitions, profile.seed)
    return plan


def _sample_length(wl: workloads.Workload, ms: int, fail) -> dict[str, Scalar]:
    names = {p.name for p in wl.params}
    if "min-ms" in names:
        return {"min-ms": ms}
    if "seconds" in names:
        return {"seconds": ms / 1000}
    raise fail(("min_sample_ms",), f"{wl.name} has no sample-length parameter")


def _is_setting(axis: str) -> bool:
    return axis in SETTING_AXES or axis.startswith(SETTING_PREFIXES)


def _arm(name: str, values: dict[str, Scalar], base: dict[str, Scalar],
         wl: workloads.Workload, loc: tuple, fail, profile: Profile) -> Arm:
    params = dict(base)
    settings = knobs.HostSettings()
    cpus = None
    kernel, memory_mb = profile.kernel, profile.memory_mb
    for axis, value in values.items():
        if axis == "thp_mode":
            if value not in knobs.THP_MODES:
                raise fail(loc + (axis,), f"{value!r} is not one of {', '.join(knobs.THP_MODES)}")
            settings.thp = str(value)
        elif axis == "thp_defrag":
            if value not in knobs.THP_DEFRAG_MODES:
                raise fail(loc + (axis,), f"{value!r} is not one of "
                           f"{', '.join(knobs.THP_DEFRAG_MODES)}")
            settings.thp_defrag = str(value)
        elif axis == "swap":
            if not knobs.SWAP_SPEC.match(str(value)):
                raise fail(loc + (axis,), f"{value!r}: expected none, file:SIZE or zram:SIZE "
                           "(SIZE like 256M)")
            settings.swap = str(value)
        elif axis == "cpus":
            if isinstance(value, bool) or not (
                    isinstance(value, int) and value > 0
                    or re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", str(value))):
                raise fail(loc + (axis,), f"{value!r}: expected a CPU count like 2 or, on "
                           "the host, a CPU list like \"0-1,3\"")
            cpus = str(value)
        elif axis == "kernel":
            if not KERNEL_NAME.match(str(value)):
                raise fail(loc + (axis,), f"{value!r}: expected host, debian:MAJOR.MINOR"
                           "[.PATCH], local:NAME or build:NAME")
            kernel = str(value)
        elif axis == "memory_mb":
            if isinstance(value, bool) or not isinstance(value, int) or value < 128:
                raise fail(loc + (axis,), f"{value!r}: expected a whole number of MiB >= 128")
            memory_mb = value
        elif axis.startswith("ksm."):
            if isinstance(value, bool) or not isinstance(value, int):
                raise fail(loc + (axis,), f"{value!r}: KSM knobs take whole numbers")
            settings.ksm[axis[4:]] = value
        elif axis.startswith("sysctl."):
            settings.sysctl[axis[7:]] = str(value)
        else:
            params[axis] = value
    try:
        wl.check(params)
    except MmlabError as exc:
        raise fail(loc, str(exc)) from exc
    if kernel != "host" and cpus is not None and not cpus.isdigit():
        raise fail(loc + ("cpus",), f"{cpus!r}: a guest takes a vCPU count, not a CPU list")
    if kernel != "host" and settings.swap not in (None, "none"):
        raise fail(loc + ("swap",), f"{settings.swap!r}: guests have no swap device yet "
                   "(only swap = \"none\" runs in QEMU)")
    return Arm(name=name, values=values, params=params, settings=settings, cpus=cpus,
               kernel=kernel, memory_mb=memory_mb)


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
        name = ",".join(f"{a}={_text(v)}" for a, v in values.items())
        arms.append(_arm(name, values, base, wl, ("matrix",), fail, profile))
    return arms


def _text(v: Scalar) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _check_baseline(profile: Profile, arms: list[Arm], fail) -> None:
    if isinstance(profile.baseline, str):
        if profile.baseline not in {a.name for a in arms}:
            raise fail(("baseline",), f"no arm is named {profile.baseline!r} (arms: "
                       f"{', '.join(a.name for a in arms)})")
        return
    for axis, value in profile.baseline.items():
        if axis not in profile.matrix:
            raise fail(("baseline", axis), f"'{axis}' is not a matrix axis")
        if _text(value) not in map(_text, profile.matrix[axis]):
            raise fail(("baseline", axis), f"{value!r} is not a value of axis '{axis}'")


def baseline_for(plan: Plan, arm: Arm) -> Arm | None:
    """The arm `arm` is judged against (None for a baseline itself).

    A string baseline names one arm.  A table baseline ({thp = "nohugepage"})
    pairs each arm with the arm that shares all its other axis values, so a
    two-axis matrix gives one comparison per value of the other axis.
    """
    base = plan.profile.baseline
    if isinstance(base, str):
        return None if arm.name == base else next(a for a in plan.arms if a.name == base)
    want = {**arm.values, **base}
    if all(_text(arm.values[k]) == _text(v) for k, v in base.items()):
        return None
    return next((a for a in plan.arms
                 if all(_text(a.values[k]) == _text(v) for k, v in want.items())), None)


def schedule(arm_names: list[str], repetitions: int, seed: int) -> list[tuple[int, str]]:
    """Every arm once per round, each round shuffled by the seed: reproducible."""
    rng = random.Random(seed)
    order = []
    for rnd in range(repetitions):
        names = list(arm_names)
        rng.shuffle(names)
        order += [(rnd, n) for n in names]
    return order


# ---------------------------------------------------------------- derived profiles

def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)          # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise MmlabError(f"cannot write {v!r} as TOML")


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def to_toml(raw: dict[str, Any]) -> str:
    """A profile's parsed TOML written back (scalars and inline tables first,
    then [params] and [matrix]); enough for the shapes profiles have."""
    top = {k: v for k, v in raw.items() if k not in ("params", "matrix", "arms")}
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in top.items()]
    for table in ("params", "matrix"):
        if raw.get(table):
            lines += ["", f"[{table}]"]
            lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in raw[table].items()]
    for arm in raw.get("arms", []):
        lines += ["", "[[arms]]"] + [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in arm.items()]
    return "\n".join(lines) + "\n"


def with_kernels(plan: Plan, kernels: list[str], note: str) -> Plan:
    """The same profile with `kernel` as an axis over `kernels` and the first of
    them as the baseline: the experiment narrow and ab run."""
    raw = tomllib.loads(plan.text)
    if raw.get("arms"):
        raise MmlabError(f"{plan.path}: kernel comparisons need a [matrix] profile, not [[arms]]")
    raw.pop("kernel", None)
    raw["matrix"] = {"kernel": kernels, **{k: v for k, v in raw.get("matrix", {}).items()
                                          if k != "kernel"}}
    raw["baseline"] = {"kernel": kernels[0]}
    source = hashlib.sha256(plan.text.encode()).hexdigest()[:16]
    text = f"# {note}; derived from {plan.path} (sha256 {source})\n" + to_toml(raw)
    return parse(text, plan.path)
