"""A profile as read: the pydantic models a TOML profile is validated into
(Profile, its explicit arms, the typed setting axes), refusing unknown keys
and values that cannot be stored (inf, NaN), and the file:line:key every
error names.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

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

from mmlab.errors import MmlabError
from mmlab.experiment.limits import MAX_GUEST_STATES, MAX_ROUNDS, MAX_SAMPLES, MAX_WARMUPS
from mmlab.machine import cpufreq, knobs
from mmlab.names import hidden_character, shown
from mmlab.workloads import execwork, output

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


# What a profile's `cmdline` may hold.  It is appended to a guest kernel's
# command line (QEMU -append) and, on a bare-metal machine, sent to the
# machine's agent as one line that its shell script reads and passes to
# `kexec --append="$append ..."`: a newline would end that line early (the
# rest read as the trial's archive), and a character a shell or the
# kernel's own parser gives a meaning ($ ` ; | & < > ( ) quotes, backslash)
# could run a command wherever the line is pasted into a script, or
# regroup the kernel's parameters.  Kernel parameters need none of them
# (console=ttyS0,115200 isolcpus=1-3 damon_stat.enabled=N crashkernel=256M@16M).
CMDLINE_SHELL = set("$`;|&<>()'\"\\")
# x86's COMMAND_LINE_SIZE is 2048, shared with mmlab's own parameters and a
# machine's; the kernel cuts a longer line without a word.
CMDLINE_MAX = 1024


def _cmdline(value: str) -> str:
    """One line of printable ASCII without shell metacharacters (CMDLINE_SHELL)."""
    bad = next((c for c in value if not " " <= c <= "~" or c in CMDLINE_SHELL), None)
    if bad is not None:
        raise ValueError(f"{value!r}: {bad!r} is not allowed; a kernel command line here is "
                         "one line of printable ASCII without $ ` ; | & < > ( ) quotes or "
                         "backslashes (it is pasted into a shell script on a bare-metal "
                         "machine)")
    if len(value) > CMDLINE_MAX:
        raise ValueError(f"{len(value)} characters: at most {CMDLINE_MAX} (the kernel cuts a "
                         "longer command line)")
    return value


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
    cmdline: Annotated[str, AfterValidator(_cmdline)] = ""   # added to a kernel's command line
    guest_states: int | None = Field(default=None, ge=1, le=MAX_GUEST_STATES, description=(
        "restored guests: the saved boots per kernel their rounds rotate over; "
        "None: 3 where the profile counts instructions, else 1"))
    attribute: bool = False       # attribution trials after the timing trials
    # which attribution runs (default: every kind the target makes): a guest's
    # guest_trace (mm path calls and call times), functions (instructions
    # by function, TCG) and state_functions (the same from each saved boot),
    # a host's stacks, locks and events
    attribution: list[Literal["guest_trace", "functions", "state_functions", "stacks", "locks",
                              "events"]] = []
    focus: str | None = None      # explain/report: only stacks through this function
    trace_count: list[str] = []   # guests: functions to count (default: the mm paths)
    trace_time: list[str] = []    # guests: functions to time (default: the first mm path)
    # workload = "exec" (execwork.py): a command or a C file, measured from outside
    command: list[str] | str = []    # {axis} substituted; {out}: a file mmwork makes and reads
    source: str | None = None        # a C reproducer (relative to the profile), built -static
    metrics_from: output.MetricsFrom | None = None
    exec_metrics: dict[str, execwork.ExecMetric | execwork.Direction] = {}
    smaps: bool = False              # the command's smaps at its exit
    per: str | None = None           # the output key of the command's units (its insns per)
    windows: dict[str, execwork.ExecWindow] = {}   # the program's own (mmlab.h), by name
    params: dict[str, Scalar] = {}
    matrix: dict[str, Annotated[list[Scalar], Field(min_length=1)]] = {}
    arms: list[ArmEntry] = []
    repetitions: int = Field(ge=1, le=MAX_ROUNDS, description="rounds before the first look: "
                             "the minimum; 3 or more where arms are compared (one arm: "
                             "`mmlab run`)")
    max_repetitions: int | None = Field(default=None, ge=3, le=MAX_ROUNDS, description="rounds "
                                        "at most; None: repetitions (one look, no rounds added)")
    budget_s: float | None = Field(default=None, gt=0, description="no rounds are added once "
                                   "the finished trials took this long")
    warmups: int | None = Field(default=None, ge=0, le=MAX_WARMUPS)
    samples_per_trial: int = Field(default=1, ge=1, le=MAX_SAMPLES)
    min_sample_ms: int | None = Field(default=None, ge=0)
    metrics: list[str] = Field(min_length=1)
    baseline: str | dict[str, Scalar]
    tolerance: float = Field(default=0.05, gt=0, lt=1)
    max_cv: float = Field(default=0.09, gt=0)   # judge.criteria.Criteria says why
    alpha: float = Field(default=0.05, gt=0, lt=1)       # false alarms, family and looks
    confidence: float = Field(default=0.90, gt=0.5, lt=1)  # the interval; "no change" test
    correction: Literal["holm", "none"] = "holm"
    seed: int = 1
    host_changes: bool = False
    bare_metal: bool = False      # every arm's kernel kexec'd on the machine $MMLAB_BARE_METAL

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
    guest_start: Literal["snapshot", "boot"] | None = None   # guests only: restored or booted
    damon: Literal["off"] | None = None   # every DAMON actor stopped (knobs.DamonActors)
    governor: cpufreq.GovernorName | None = None   # the host's CPU clock, guests' too
    turbo: cpufreq.TurboState | None = None
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



def key_lines(text: str) -> dict[str, int]:
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



def where(path: str, text: str, loc: tuple) -> str:
    """'p.toml:12: matrix.thp': the file, line and key an error is about
    (a key shown escaped, names.shown, so the error stays one line)."""
    parts = [shown(str(p)) for p in loc if not isinstance(p, int)]
    lines = key_lines(text)
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in lines:
            return f"{path}:{lines[key]}: {'.'.join(parts)}"
    return f"{path}: {'.'.join(parts) or '(top level)'}"



def message(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return "unknown key" if err["type"] == "extra_forbidden" else \
        err["msg"].removeprefix("Value error, ")


def refuse_hidden(raw: dict, path: str, text: str = "") -> None:
    """Refuse the first key or text `hidden` finds, at its file:line:key."""
    found = hidden(raw)
    if found:
        loc, value, char = found
        raise MmlabError(f"{where(path, text, loc)}: {value!r} holds {char}, a control or "
                         "format character, which a terminal would not show as it is")


def hidden(raw: object, loc: tuple = ()) -> tuple[tuple, str, str] | None:
    """The first key or text of a profile's TOML holding a character a
    terminal does not show as itself (names.hidden_character): (its key's
    loc, the text, the character).  Keys and values become arm names, table
    rows, file names and one-line errors, where a BEL, an ESC sequence or an
    RLO would ring, restyle or reverse what is printed; escaped TOML
    ("\\u202e") reaches them as the character.  `description` may hold
    newlines and tabs: it is free text; `cmdline` has a stricter rule of its
    own (_cmdline)."""
    if isinstance(raw, dict):
        for key, value in raw.items():
            found = hidden(key, (*loc, key)) or hidden(value, (*loc, key))
            if found:
                return found
    elif isinstance(raw, list):
        return next(filter(None, (hidden(v, (*loc, i)) for i, v in enumerate(raw))), None)
    elif isinstance(raw, str) and loc != ("cmdline",):
        text = raw.replace("\n", "").replace("\t", "") if loc == ("description",) else raw
        char = hidden_character(text)
        return (loc, raw, char) if char else None
    return None
