"""A profile expanded into the plan an experiment runs: its arms (everything a
target needs), the schedule, and the workload's table, stored whole.

Expansion checks what the profile's models cannot alone: each arm's
parameters by mmwork, guest-only settings, NUMA node sizes, the baseline;
every error names file, line and key.  Plans derived from a plan (limits from
the command line, a kernel axis for narrow and ab) are built the same way.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

import tomli_w
from pydantic import BaseModel, ConfigDict, ValidationError

from mmlab import workloads
from mmlab.errors import MmlabError
from mmlab.experiment import source
from mmlab.experiment.limits import MAX_ROUNDS, MIN_PAIRS
from mmlab.experiment.profile import Profile, Scalar, SettingAxes, message, refuse_hidden, where
from mmlab.experiment.schedule import schedule
from mmlab.kernels import images, specs
from mmlab.machine import knobs
from mmlab.names import axis_text
from mmlab.workloads import execwork, insns, mmwork


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
    guest_start: str = "snapshot"      # guests: restored from a saved boot, or booted
    round: int = 0                     # set per trial as it runs: a guest's saved boot follows it
    bare_metal: bool = False           # its kernel kexec'd on the bare-metal machine
    control_of: str | None = None      # a matched-state control of this arm (controls.py)
    control: str | None = None         # the state it forces, e.g. "thp=nohugepage"

    @property
    def target(self) -> str:
        """Where its trials run: "host", "qemu:<kernel>" or "bare-metal" (one
        machine for every kernel)."""
        if self.bare_metal:
            return "bare-metal"
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

    def smallest_p(self, n: int | None = None) -> float:
        """The smallest two-sided p that n rounds (the most this profile may
        run) can give, by the test the judge uses at n: each trial is one
        observation, so it is Mann-Whitney's 2 / C(2n, n) below MIN_PAIRS
        rounds (unpaired) and Wilcoxon signed-rank's 2 / 2^n from there on
        (paired): 0.1 for n = 3, 0.0079 for 5, 0.031 for 6."""
        n = n or self.profile.rounds_at_most
        return min(1.0, 2 / 2 ** n if n >= MIN_PAIRS else 2 / math.comb(2 * n, n))

    def rounds_that_decide(self) -> int:
        """The fewest rounds from which every number of rounds can reach a
        verdict of change: its smallest p below alpha, or below alpha / tests
        under Holm (whose smallest adjusted p is p x tests).  Not merely the
        first that can: with two tests 5 rounds can (unpaired) and 6 cannot
        (paired, 0.031 > 0.025), so the advice is 7."""
        level = self.profile.alpha / (self.tests() if self.profile.correction == "holm" else 1)
        n = MAX_ROUNDS
        while n > MIN_ROUNDS and self.smallest_p(n - 1) < level:
            n -= 1
        return n

    def tests(self) -> int:
        """The family each look corrects over: pairs x timed metrics (a
        profile of one arm is run as a pair by `ab` and `narrow`); a count
        is judged by the count rule, outside it, from 3 rounds."""
        pairs = sum(baseline_for(self, a) is not None for a in self.arms) or 1
        return pairs * sum(not insns.counted(self.workload, m) for m in self.profile.metrics)

    def warnings(self) -> list[str]:
        if not self.tests():
            return []
        p, n, alpha = self.smallest_p(), self.profile.rounds_at_most, self.profile.alpha
        never = ("this profile can show 'no change' but never a significant regression or "
                 "improvement")
        use = f"use {self.rounds_that_decide()} or more"
        if p >= alpha:
            return [f"{self.path}: with at most {n} rounds the smallest possible p is "
                    f"{p:.3g} >= alpha {alpha}: {never} ({use})"]
        m = self.tests()
        if self.profile.correction == "holm" and p * m >= alpha:
            return [f"{self.path}: with at most {n} rounds the smallest possible p is {p:.3g}, "
                    f"and Holm over its {m} tests needs one below {alpha / m:.3g}: {never} "
                    f"({use}, or fewer arms or metrics)"]
        return []


# ---------------------------------------------------------------- loading

def load(path: str | Path) -> Plan:
    """Read (source.read), validate and expand a profile; every error names
    file, line and key."""
    return parse(source.read(path), str(path))


def parse(text: str, path: str = "<profile>") -> Plan:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MmlabError(f"{path}: {exc}") from exc
    refuse_hidden(raw, path, text)
    try:
        profile = Profile.model_validate(raw)
    except ValidationError as exc:
        raise MmlabError(f"{where(path, text, exc.errors()[0]['loc'])}: "
                         f"{message(exc)}") from exc
    plan = build(profile, text, path)
    _known_kernels(plan)
    return plan


def _known_kernels(plan: Plan) -> None:
    """Each Debian kernel the profile names is cached or served by the
    catalog: an unknown one is refused here, naming its key, before a store
    is made or a fetch begins (a trial would fail on it after both).  Plans
    derived by the tracker, ab and narrow name releases the catalog gave."""
    cached = {k.name for k in images.cached()}
    for arm in plan.arms:
        if not arm.kernel.startswith("debian:") or arm.kernel in cached:
            continue
        try:
            specs.check(arm.kernel.removeprefix("debian:"))
        except MmlabError as exc:
            key = ("kernel",) if "kernel" not in arm.values else \
                ("matrix", "kernel") if plan.profile.matrix else ("arms", "set", "kernel")
            raise MmlabError(f"{where(plan.path, plan.text, key)}: {exc}") from exc
        cached.add(arm.kernel)


def build(profile: Profile, text: str, path: str) -> Plan:
    """Expand a validated profile into its arms and schedule.  Each arm's
    parameters are checked by mmwork itself, once, here."""
    def fail(loc: tuple, msg: str) -> MmlabError:
        return MmlabError(f"{where(path, text, loc)}: {msg}")

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
    if set(profile.metrics) & wl.cpu_metrics():
        base[CPU_TIME] = True    # its system calls are made only where CPU time is judged
    arms = _expand(profile, wl, base, fail)
    if len(arms) > 1 and profile.repetitions < MIN_ROUNDS:
        raise fail(("repetitions",), f"{profile.repetitions}: arms are compared from "
                   f"{MIN_ROUNDS} rounds on")
    _check_baseline(profile, arms, fail)
    _counted_here(profile, wl, arms, fail)
    return Plan(profile=profile, text=text, path=path, workload=wl, arms=arms,
                order=schedule([a.name for a in arms], profile.repetitions, profile.seed))


MIN_ROUNDS = 3      # a comparison's least rounds: fewer cannot give a verdict
CPU_TIME = "cpu-time"   # mmwork's flag: each timed window's thread CPU clock read around it
MIN_NODE_MB = 128   # a guest NUMA node's least memory: smaller nodes fail to boot
EXEC_KEYS = ("command", "source", "metrics_from", "exec_metrics", "smaps", "per", "windows")


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
                              smaps=profile.smaps, timeout_s=profile.timeout_s,
                              per=profile.per, windows=profile.windows)
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
        raise fail(loc + (axis,), f"{values.get(axis)!r}: {message(exc)}") from exc
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
    if kernel == "host" and axes.guest_start is not None:
        raise fail(loc + ("guest_start",), f"{axes.guest_start!r}: only a guest starts from a "
                   "snapshot or a boot")
    if profile.bare_metal:
        _bare_metal(profile, axes, kernel, loc, fail)
    elif kernel == "host" and cpus is not None:
        try:
            mmwork.parse_cpus(cpus)
        except MmlabError as exc:
            raise fail(loc + ("cpus",), f"{exc} (a host arm runs on this machine's CPUs; a "
                       "guest's vCPU count may exceed them, sharing them)") from exc
    memory_mb = axes.memory_mb or profile.memory_mb
    if kernel != "host" and not profile.bare_metal and memory_mb > (have := host_memory_mb()):
        raise fail(loc + ("memory_mb",) if axes.memory_mb else ("memory_mb",),
                   f"{memory_mb} MiB is more than this machine's {have} MiB "
                   "(MemTotal): a guest's memory is taken from the host's")
    nodes = axes.numa_nodes or 1
    if memory_mb < nodes * MIN_NODE_MB:
        raise fail(loc + ("numa_nodes",), f"{nodes} NUMA nodes in {memory_mb} MiB: a guest "
                   f"node needs {MIN_NODE_MB} MiB or more (raise memory_mb)")
    settings = knobs.HostSettings(thp=axes.thp_mode, thp_defrag=axes.thp_defrag, swap=axes.swap,
                                  ksm=axes.ksm,
                                  sysctl={k: axis_text(v) for k, v in axes.sysctl.items()},
                                  damon=axes.damon, governor=axes.governor, turbo=axes.turbo)
    return Arm(name=name, values=values, params=params, settings=settings, cpus=cpus,
               kernel=kernel, memory_mb=memory_mb, numa_nodes=nodes,
               guest_start=axes.guest_start or "snapshot", bare_metal=profile.bare_metal)


def host_memory_mb() -> int:
    """This machine's memory (MemTotal, MiB): the most a guest can be given.
    QEMU reserves a guest's memory lazily, so a larger one may start, and
    then fail or swap the host as its kernel touches its memory."""
    with open("/proc/meminfo") as meminfo:
        kb = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    return kb // 1024


def _counted_here(profile: Profile, wl: workloads.Workload, arms: list[Arm], fail) -> None:
    """A host arm's instruction metrics come from the CPU's own counter
    (insns.perf_status).  Where this machine has none, every trial counting
    alone fails, and a count beside a time is judged on nothing: refused
    here, before anything is stored, with why.  Counts per syscall and fault
    come from the QEMU plugin alone: on a host arm they are refused always."""
    host = next((a for a in arms if a.target == "host"), None)
    stays = [i for i, m in enumerate(profile.metrics)
             if wl.stay_metric(m) or wl.event_metric(m)]
    if stays and host is not None:
        raise fail(("metrics", stays[0]), f"{profile.metrics[stays[0]]} on the host (arm "
                   f"{host.name}): only mmlab's QEMU plugin counts per syscall and fault, "
                   "and events; a guest kernel counts it (kernel = \"debian:6.12\", say)")
    counted = [i for i, m in enumerate(profile.metrics) if wl.metric(m).unit == insns.UNIT]
    if not counted or host is None:
        return
    ok, why = insns.perf_status()
    if not ok:
        raise fail(("metrics", counted[0]), f"{profile.metrics[counted[0]]} on the host "
                   f"(arm {host.name}): {why}; a guest kernel counts it (kernel = "
                   "\"debian:6.12\", say)")


def _bare_metal(profile: Profile, axes: SettingAxes, kernel: str, loc: tuple, fail) -> None:
    """What an arm on a bare-metal machine cannot ask for: the machine has
    its own CPUs, memory and disk, and its base kernel is not under test."""
    if kernel == "host":
        raise fail(("bare_metal",), "kernel = host: name the kernels to kexec into (the "
                   "machine's own kernel is its base, not under test)")
    why = "a guest's setting: a bare-metal machine has its own CPUs and memory"
    if "memory_mb" in profile.model_fields_set:
        raise fail(("memory_mb",), why)
    for axis in ("cpus", "numa_nodes", "guest_start", "memory_mb"):
        if getattr(axes, axis) is not None:
            raise fail(loc + (axis,), why)
    if axes.swap and axes.swap.startswith("file:"):
        raise fail(loc + ("swap",), f"{axes.swap!r}: a bare-metal machine's disk is not "
                   "mmlab's to swap to (zram:SIZE is)")


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


@dataclass(frozen=True)
class Pair:
    """An arm and the arm it is judged against: what verdicts compare and
    attribution explains."""
    arm: Arm
    baseline: Arm

    @property
    def differing_axes(self) -> set[str]:
        return {k for k in self.arm.values.keys() | self.baseline.values.keys()
                if str(self.arm.values.get(k)) != str(self.baseline.values.get(k))}


def pairs(plan: Plan) -> list[Pair]:
    """Every arm that has a baseline, with it, in arm order."""
    out = []
    for arm in plan.arms:
        base = baseline_for(plan, arm)
        if base is not None:
            out.append(Pair(arm, base))
    return out


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
        raise MmlabError(f"{plan.path}: {message(exc)}") from exc
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
