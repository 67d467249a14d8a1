"""Any command as a workload: `workload = "exec"` profiles, `source = "repro.c"`
and `mmlab run exec -- CMD ARGS...`.

The command runs as the child of `mmwork exec` (workloads/exec.c), on the
host and in guests alike, so it takes the path every built-in workload takes:
the Plan carries an ExecWorkload, a target runs mmwork with the arm's
settings, and mmwork measures around the command from outside (rusage of the
process tree, vmstat deltas, THP/swap/KSM state, smaps at its exit when
asked), never while it runs.  Each sample comes back with what the command
printed; `measured` turns that into metrics:

- `stress-ng-yaml`: stress-ng's `-Y FILE` (write `-Y {out}`), whose metrics
  are declared here with stress-ng's own statistic (total ops over the run);
- `key=value`: `name=number` tokens, as single-file reproducers print them;
- `json`: one JSON object per line, nested keys joined by dots.

A key printed twice counts with its last value; keys nobody declared may
hold any text.

Instructions (a counting pass, insns.py) are counted over the whole command,
window "command" (marker 0; exec.c says what it includes), and over the
windows the program marks itself with mmlab.h (markers 1-7, named by the
profile's `windows`).  Each window's instructions are per unit of work one
window did: `per` names the output key that holds it (the command's: its
whole run; default one run).  Output that does not parse, lacks a declared key or holds
no number there fails that trial with one line saying why.

Axis values and parameters are substituted into the command's arguments as
`{name}`; `{name?TEXT}` is TEXT when the (boolean) value is true, and the
argument is dropped when it is false or not set.  `{out}` is a fresh file mmwork
creates (and reads back as the output); `{source}` the compiled reproducer.
"""

from __future__ import annotations

import re
import shlex
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from mmlab.errors import MmlabError
from mmlab.machine import proc
from mmlab.names import axis_text
from mmlab.workloads import Metric, Param, Window, Workload, csource, exec_table, insns
from mmlab.workloads.output import METRICS_FROM, figures
from mmlab.workloads.samples import UNIT_TOKEN, Sample

Direction = Literal["higher", "lower"]
RESERVED = ("out", "source")        # placeholders mmwork and mmlab fill themselves
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_-]*)(?:\?([^{}]*))?\}")
UNITS = {"ns": "ns", "us": "us", "ms": "ms", "s": "s", "per_s": "per s", "pages": "pages",
         "bytes": "bytes", "kb": "KiB"}
# The units of times, sizes and counts: a figure in one of them cannot be
# negative, and one that is fails its trial (a change, which can be, is
# declared with a unit of its own, e.g. unit = "KiB change").
NOT_NEGATIVE = ("ns", "us", "ms", "s", "pages", "bytes", "KiB", insns.UNIT)
# Figures that say how much work was done: kept as counts (CPU time per op).
COUNT_KEYS = {"ops": "ops", "bogo-ops": "ops", "pages": "pages", "rounds": "rounds"}


class ExecWindow(BaseModel):
    """A window the program marks with mmlab.h's MMLAB_BEGIN(id) and
    MMLAB_END(id), as a profile names it."""
    model_config = ConfigDict(extra="forbid")
    id: int = Field(ge=1, le=7)
    per: str | None = None          # the output key: units of work one window does


COMMAND_WINDOW = "command"          # the whole command: exec.c's marker 0


class ExecMetric(BaseModel):
    """A metric the command prints, as a profile declares it."""
    model_config = ConfigDict(extra="forbid")
    key: str | None = None          # where the output has it; default: the metric's name
    direction: Direction
    unit: str | None = None         # default: the unit token of the name
    help: str = ""


# Seed 000's figures, in stress-ng's words and with its statistic.
STRESS_NG = {
    "ops_per_s_real": ExecMetric(key="bogo-ops-per-second-real-time", direction="higher",
                                 unit="ops/s", help="stress-ng bogo ops per second of wall "
                                 "time (total ops over the run, as stress-ng reports)"),
    "ops_per_s_cpu": ExecMetric(key="bogo-ops-per-second-usr-sys-time", direction="higher",
                                unit="ops/s", help="stress-ng bogo ops per usr+sys second "
                                "(total ops over total CPU time, as stress-ng reports)"),
    "wall_s": ExecMetric(key="wall-clock-time", direction="lower", unit="s",
                         help="stress-ng's wall clock time of the run"),
    "usr_s": ExecMetric(key="user-time", direction="lower", unit="s",
                        help="stress-ng's user time of all instances (whole run)"),
    "sys_s": ExecMetric(key="system-time", direction="lower", unit="s",
                        help="stress-ng's system time of all instances (whole run)"),
    "max_rss_kb": ExecMetric(key="max-rss", direction="lower", unit="KiB",
                             help="stress-ng's largest instance RSS"),
}

# What mmwork measures around every command, from outside.
OUTSIDE = {
    "outside_wall_s": ("s", "wall time of the command from fork to exit (mmwork, outside)"),
    "outside_usr_s": ("s", "user time of the command's process tree (rusage, outside)"),
    "outside_sys_s": ("s", "system time of the command's process tree (rusage, outside)"),
    "outside_cpu_s": ("s", "usr+sys time of the command's process tree (rusage, outside)"),
    "outside_max_rss_kb": ("KiB", "largest RSS in the command's process tree (rusage)"),
}


def _outside(sample: Sample) -> dict[str, float | None]:
    usr, sys_ = sample.rusage["user_s"], sample.rusage["sys_s"]
    return {"outside_wall_s": sample.counts.get("command_wall_s"), "outside_usr_s": usr,
            "outside_sys_s": sys_, "outside_cpu_s": usr + sys_,
            "outside_max_rss_kb": sample.counts.get("command_max_rss_kb")}


def stress_ng_figures(text: str, names: tuple[str, ...]) -> dict[str, float | None]:
    """mmlab's `names` (keys of STRESS_NG) read from stress-ng's YAML output."""
    found = figures("stress-ng-yaml", text)
    return {name: found[STRESS_NG[name].key or name] for name in names}


def run_stress_ng(argv: list[str], names: tuple[str, ...]) -> dict[str, float | None]:
    """stress-ng run as it is, not as a workload (the peer the benchmarks set
    mmlab beside), its figures read back from its own YAML (-Y)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "stress-ng.yaml")
        proc.call([*argv, "-Y", str(out)], what=" ".join(argv[:3]))
        return stress_ng_figures(out.read_text(), names)


# ---------------------------------------------------------------- the command line

def substitute(arg: str, values: Mapping[str, object]) -> str | None:
    """One argument with its placeholders filled; None when it is to be
    dropped (it held only placeholders and they came out empty)."""
    def fill(m: re.Match) -> str:
        name, text = m.group(1), m.group(2)
        if name == "out":
            return m.group(0)               # mmwork's to fill, where the command runs
        if text is not None and name not in values:
            return ""                       # an optional flag, not set
        if name not in values:
            raise MmlabError(f"command argument {arg!r}: no value for {{{name}}} " +
                             ("(only with source = FILE)" if name == "source" else
                              "(set it in [params] or make it an axis)"))
        value = values[name]
        if text is None:
            return axis_text(value)
        if not isinstance(value, bool):
            raise MmlabError(f"command argument {arg!r}: {{{name}?...}} takes true or false, "
                             f"not {value!r}")
        return text if value else ""
    out = PLACEHOLDER.sub(fill, arg)
    return None if not out and PLACEHOLDER.search(arg) else out


def placeholders(command: tuple[str, ...]) -> list[str]:
    """The parameter names a command takes, in order of appearance."""
    names = [m.group(1) for arg in command for m in PLACEHOLDER.finditer(arg)]
    return [n for n in dict.fromkeys(names) if n not in RESERVED]


def shared_libraries(program: Path) -> list[Path]:
    """The ELF interpreter and shared libraries `program` loads (ldd), or
    nothing for a static binary."""
    found = proc.call(["ldd", program], what=f"ldd {program}", check=False)
    if found.returncode or "statically linked" in found.stdout:
        return []
    libs = []
    for line in found.stdout.splitlines():
        m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
        if m:
            libs.append(Path(m.group(1)))
        elif "not found" in line:
            raise MmlabError(f"{program}: needs {line.split()[0]}, which is not installed")
    return libs


@dataclass(frozen=True)
class ExecWorkload(Workload):
    """A command as a workload, made from a profile or the command line and
    stored whole in the Plan (the C source included), so that a stored
    experiment reads back and resumes without the profile or the file."""
    kind: str = "exec"
    command: tuple[str, ...] = ()          # placeholders as written
    metrics_from: str | None = None
    keys: tuple[tuple[str, str], ...] = ()  # (metric, key in the output)
    smaps: bool = False
    timeout_s: float = 600.0
    source_name: str | None = None         # the C file as the profile named it
    source_text: str | None = None
    per: tuple[tuple[str, str | None], ...] = ()   # (window, output key of its units)

    def binary(self) -> Path:
        """The compiled reproducer (compiled on first use, cached by hash)."""
        if self.source_text is None:
            raise MmlabError("{source}: this exec workload has no source")
        return csource.binary(self.source_text, self.source_name or "repro.c")

    def argv(self, params: Mapping[str, object], program: str | None = None) -> list[str]:
        """The command with `params` substituted ({out} is left to mmwork);
        {source} is the compiled reproducer, or `program` (a bundle names
        the file there instead of compiling it)."""
        values = dict(params)
        if self.source_text is not None:
            values["source"] = program or str(self.binary())
        return [a for a in (substitute(arg, values) for arg in self.command) if a is not None]

    def args(self, params: Mapping[str, object]) -> list[str]:
        """mmwork exec's arguments; the program by its path on this machine,
        where a guest finds it too (its files are packed at the same paths)."""
        params = dict(params)
        counting = ["--insns"] if params.pop("insns", False) else []
        return ["--timeout-s", f"{self.timeout_s:g}", *(["--smaps"] if self.smaps else []),
                *counting, "--", str(self.program(params)), *self.argv(params)[1:]]

    def program(self, params: Mapping[str, object]) -> Path:
        """The command's program as a path on this machine."""
        name = self.argv(params)[0]
        found = shutil.which(name)
        if not found:
            raise MmlabError(f"{name}: not found on this machine (the command's program)")
        return Path(found).absolute()

    def programs(self, params: Mapping[str, object]) -> list[Path]:
        """What a guest needs packed: the program and the libraries it
        loads, and the compiled reproducer wherever the command names
        {source} (`env K=V {source}` runs env, which runs it)."""
        program = self.program(params)
        reproducer = [self.binary()] if self.source_text is not None else []
        return [program, *shared_libraries(program),
                *(p for p in reproducer if p != program)]

    def check(self, params: Mapping[str, object]) -> None:
        """Every placeholder has a value, every value a placeholder, and the
        program exists (a reproducer compiles)."""
        names = placeholders(self.command)
        for name in params:
            if name in RESERVED:
                raise MmlabError(f"parameter '{name}': {{{name}}} is mmlab's own placeholder")
            if name not in names:
                raise MmlabError(f"parameter '{name}' is not used by the command (its "
                                 f"placeholders: {', '.join(f'{{{n}}}' for n in names) or 'none'})")
        if not self.argv(params):
            raise MmlabError("the command is empty")
        self.program(params)

    def measured(self, sample: Sample) -> Sample:
        """The sample with the command's figures as metrics, beside what mmwork
        measured outside it; MmlabError (the trial fails) if the output is
        malformed or lacks a declared key."""
        metrics: dict[str, float | None] = _outside(sample)
        counts = dict(sample.counts)
        found: dict[str, float] = {}
        if self.metrics_from:
            found = self._figures(sample)
            metrics.update({name: found[key] for name, key in self.keys})
            counts.update({COUNT_KEYS[k]: v for k, v in found.items() if k in COUNT_KEYS})
        for window, key in self.per:
            counts[insns.units_count(window)] = found[key] if key else 1.0
        metrics.update(self._perf_counts(counts))
        return sample.model_copy(update={"metrics": {**sample.metrics, **metrics},
                                         "counts": counts})

    def _figures(self, sample: Sample) -> dict[str, float]:
        """The output's figures, every declared key and window unit among them."""
        where = f"exec sample {sample.sample}"
        wanted = {key: f"metric {name}" for name, key in self.keys}
        units = {m.name: m.unit for m in self.metrics}
        counted = [key for name, key in self.keys if units[name] in NOT_NEGATIVE]
        for window, key in self.per:
            if key:
                wanted.setdefault(key, f"the units of window {window}")
                counted.append(key)
        try:
            found = figures(self.metrics_from or "", sample.output or "", tuple(wanted),
                            tuple(counted))
        except MmlabError as exc:
            raise MmlabError(f"{where}: {exc}") from None
        for key, what in wanted.items():
            if key not in found:
                have = ", ".join(list(found)[:6]) or "nothing"
                raise MmlabError(f"{where}: the {self.metrics_from} output has no "
                                 f"'{key}' ({what}); it has {have}")
        return found

    def _perf_counts(self, counts: Mapping[str, float]) -> dict[str, float | None]:
        """Instruction metrics from the perf counts mmwork took (where the
        CPU has counters; the plugin's are added by insns.from_plugin)."""
        out: dict[str, float | None] = {}
        for w in self.windows:
            n = counts.get(f"insns_window{w.marker}_windows")
            units = counts.get(insns.units_count(w.name))
            if n and units:
                out[w.kernel_metric] = counts[f"insns_window{w.marker}_kernel_insns"] / n / units
                out[w.user_metric] = counts[f"insns_window{w.marker}_user_insns"] / n / units
        return out


AnyWorkload = Annotated[Annotated[Workload, Tag("mmwork")]
                        | Annotated[ExecWorkload, Tag("exec")],
                        Discriminator(lambda v: (v.get("kind") if isinstance(v, dict)
                                                 else getattr(v, "kind", None)) or "mmwork")]


# ---------------------------------------------------------------- building one

class ProfileKeyError(MmlabError):
    """A problem with one profile key, which `key` names (for its line)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def _unit(name: str) -> str:
    m = UNIT_TOKEN.search(name)
    return UNITS[m.group(2)] if m else ""


def _metrics(metrics_from: str | None, declared: Mapping[str, ExecMetric | str]
             ) -> tuple[tuple[Metric, ...], tuple[tuple[str, str], ...]]:
    """The workload's metrics: what mmwork measures outside, stress-ng's own
    when it is the source, and the declared ones (which win)."""
    specs: dict[str, ExecMetric] = dict(STRESS_NG) if metrics_from == "stress-ng-yaml" else {}
    for name, spec in declared.items():
        if not UNIT_TOKEN.search(name):
            raise ProfileKeyError(f"exec_metrics.{name}", "a metric's name carries its unit "
                            "(_ns, _us, _ms, _s, _per_s, _pages, _bytes, _kb), e.g. "
                            "advise_ns_per_page")
        if name in OUTSIDE:
            raise ProfileKeyError(f"exec_metrics.{name}",
                                  "is measured by mmlab outside the command")
        specs[name] = spec if isinstance(spec, ExecMetric) else ExecMetric(direction=spec)
    if specs and not metrics_from:
        raise ProfileKeyError("metrics_from", "declared metrics need metrics_from = "
                        f"{' | '.join(METRICS_FROM)}")
    metrics = [Metric(n, unit, "lower", help_) for n, (unit, help_) in OUTSIDE.items()]
    metrics += [Metric(n, s.unit or _unit(n), s.direction,
                       s.help or f"'{s.key or n}' as the command prints it ({metrics_from})")
                for n, s in specs.items()]
    return tuple(metrics), tuple((n, s.key or n) for n, s in specs.items())


def _window(name: str, marker: int, per: str | None, what: str) -> Window:
    """A counted window and its metrics' names: per the output key's unit
    (`pages` -> _per_pages, `bogo-ops` -> _per_bogo_ops), or per run."""
    unit = re.sub(r"[^a-z0-9]+", "_", per.lower()).strip("_") if per else "run"
    if not unit:
        raise ProfileKeyError("per", f"{per!r} names no unit (an output key such as pages)")
    return Window(name=name, unit=unit, help=what, marker=marker,
                  kernel_metric=f"{name}_kernel_insns_per_{unit}",
                  user_metric=f"{name}_user_insns_per_{unit}")


def _windows(per: str | None, marked: Mapping[str, ExecWindow], metrics_from: str | None
             ) -> tuple[Window, ...]:
    """The whole command's window and the program's own (mmlab.h), each
    counted per unit its `per` key names in the output."""
    if (per or any(w.per for w in marked.values())) and not metrics_from:
        raise ProfileKeyError("per", "units read from the output need metrics_from = "
                              f"{' | '.join(METRICS_FROM)}")
    named: dict[int, str] = {}
    for name, w in marked.items():
        if w.id in named:
            raise ProfileKeyError(f"windows.{name}", f"id {w.id} names two windows "
                                  f"({named[w.id]} and {name})")
        named[w.id] = name
        if name == COMMAND_WINDOW or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise ProfileKeyError(f"windows.{name}", "a window's name is lower-case letters, "
                                  f"digits and _, and not '{COMMAND_WINDOW}' (the whole command)")
    return (_window(COMMAND_WINDOW, 0, per, "the whole command, from its exec to its exit"),
            *(_window(name, w.id, w.per, f"MMLAB_BEGIN({w.id}) .. MMLAB_END({w.id}) "
                      "in the program") for name, w in marked.items()))


def build(command: list[str] | str, *, source: str | None = None, base: Path = Path("."),
          metrics_from: str | None = None,
          declared: Mapping[str, ExecMetric | str] | None = None,
          smaps: bool = False, timeout_s: float = 600.0, per: str | None = None,
          windows: Mapping[str, ExecWindow] | None = None) -> ExecWorkload:
    """An ExecWorkload from a profile's keys (or the command line's); a
    source path is read relative to `base` (the profile's directory) and
    kept whole, and compiled here so that a bad one fails before any trial."""
    try:
        cmd = tuple(shlex.split(command) if isinstance(command, str) else command)
    except ValueError as exc:          # shlex: "No closing quotation", "No escaped character"
        raise ProfileKeyError("command", f"{command!r}: {exc}") from exc
    text = None
    if source is not None:
        text = read_source(base / source)
        cmd = cmd or ("{source}",)
        if not any("{source}" in a for a in cmd):
            raise ProfileKeyError("command", "with source, the command names the compiled program "
                            "as {source}")
    if not cmd:
        raise ProfileKeyError("command", 'an exec workload needs command = ["program", "arg", ...] '
                        'or source = "repro.c"')
    if metrics_from is not None and metrics_from not in METRICS_FROM:
        raise ProfileKeyError("metrics_from", f"{metrics_from!r} is not one of "
                              f"{', '.join(METRICS_FROM)}")
    metrics, keys = _metrics(metrics_from, declared or {})
    counted = _windows(per, windows or {}, metrics_from)
    metrics += tuple(Metric(m, insns.UNIT, "lower", f"{side} instructions per {w.unit} of "
                            f"{w.name} ({w.help}; a counting pass)")
                     for w in counted
                     for side, m in (("kernel", w.kernel_metric), ("user", w.user_metric)))
    names = placeholders(cmd)
    summary = " ".join(cmd)
    if text is not None:
        summary = summary.replace("{source}", f"{source} (sha256 {csource.sha256(text)[:16]})")
    table = exec_table()
    wl = ExecWorkload(
        name="exec", seed="", summary=summary,
        params=tuple(Param(n, "text", "", "substituted into the command") for n in names),
        metrics=metrics, mm_paths=(), vmstat=tuple(table["vmstat"]), tracepoints=(),
        host_settings=(), command=cmd, metrics_from=metrics_from, keys=keys, smaps=smaps,
        timeout_s=timeout_s, source_name=source, source_text=text, windows=counted,
        per=((COMMAND_WINDOW, per), *((name, w.per) for name, w in (windows or {}).items())))
    if text is not None:
        try:
            wl.binary()
        except MmlabError as exc:
            raise ProfileKeyError("source", str(exc)) from exc
    return wl


def read_source(path: Path) -> str:
    """A C source's text: a regular file of UTF-8 text, or a ProfileKeyError
    naming it (a FIFO would hang the reader, a binary would fail deep in gcc)."""
    if not path.is_file():
        raise ProfileKeyError("source", f"{path}: " + ("not a regular file" if path.exists()
                                                         else "no such file"))
    try:
        return path.read_text()
    except OSError as exc:
        raise ProfileKeyError("source", f"{path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ProfileKeyError("source", f"{path}: not UTF-8 text (byte {exc.start})") from exc


def parse_window_option(text: str) -> tuple[str, ExecWindow]:
    """--window NAME=ID[:KEY] -> (name, declaration)."""
    name, _, rest = text.partition("=")
    number, _, key = rest.partition(":")
    if not name or not number.isdigit() or not 1 <= int(number) <= 7:
        raise MmlabError(f"--window {text!r}: expected NAME=ID[:KEY] with ID 1 to 7 "
                         "(MMLAB_BEGIN(ID) in the program)")
    return name, ExecWindow(id=int(number), per=key or None)


def parse_metric_option(text: str) -> tuple[str, ExecMetric]:
    """--metric NAME[=KEY]:higher|lower -> (name, declaration)."""
    spec, _, direction = text.rpartition(":")
    name, _, key = spec.partition("=")
    if direction not in ("higher", "lower") or not name:
        raise MmlabError(f"--metric {text!r}: expected NAME[=KEY]:higher or NAME[=KEY]:lower")
    return name, ExecMetric(key=key or None, direction=direction)
