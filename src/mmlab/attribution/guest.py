"""In-guest tracing for attribution trials: the shell lines a guest's
/trial.sh runs around mmwork to count calls (kprobes summed by hist
triggers) and time them (function_graph), and the parser of what they print.

The host kernel here has neither kprobes nor function_graph, while Debian's
guest kernels have both, so function counts and call times come from
guests.  These lines never run in a timing trial.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pydantic import BaseModel

from mmlab.workloads.samples import Sample, work_units


@dataclass(frozen=True)
class Instrumentation:
    """In-guest tracing for attribution runs, never for clean timing runs.

    `count`: functions whose calls are counted (a kprobe each, summed by a
    hist trigger).  `time`: functions whose every call is timed by the
    function_graph tracer (count, total and longest, in microseconds)."""
    count: tuple[str, ...] = ()
    time: tuple[str, ...] = ()

    def script_before(self) -> list[str]:
        t = "/sys/kernel/tracing"
        lines = [f"echo 0 > {t}/tracing_on", f"echo 65536 > {t}/buffer_size_kb"]
        for f in self.count:
            q = shlex.quote(f)
            # A trigger on a disabled event runs in "soft" mode: counted by the
            # hist, never written to the ring buffer the timings are read from.
            # A function this kernel lacks (or blacklists for kprobes) is skipped.
            lines += [f"{{ echo 'p:mmlab/{f} {f}' >> {t}/kprobe_events && "
                      f"echo 'hist:keys=common_pid:vals=hitcount' "
                      f"> {t}/events/mmlab/{q}/trigger; }}"
                      f" 2>/dev/null || echo 'SKIP {f}' >&2"]
        if self.time:
            lines += [f"echo {shlex.quote(f)} >> {t}/set_ftrace_filter 2>/dev/null || "
                      f"echo 'SKIP {f}' >&2" for f in self.time]
            lines += [f"echo function_graph > {t}/current_tracer"]
        return lines + [f"echo 1 > {t}/tracing_on"]

    def script_after(self) -> list[str]:
        t = "/sys/kernel/tracing"
        lines = [f"echo 0 > {t}/tracing_on"]
        for f in self.count:
            q = shlex.quote(f)
            lines.append(f"[ -e {t}/events/mmlab/{q}/hist ] && echo \"COUNT {f} "
                         f"$(grep -o 'hitcount: *[0-9]*' {t}/events/mmlab/{q}/hist | "
                         "awk '{s+=$2} END {print s+0}')\" >&2 || true")
        if self.time:
            # function_graph lines end in "| name();" with the duration and its unit before.
            lines.append(
                f"awk '/\\(\\);/ {{ for (i = 1; i <= NF; i++) if ($i ~ /^(us|ms|s)$/) {{ "
                "v = $(i-1); u = $i; f = $NF; sub(/\\(\\);/, \"\", f); "
                "m = (u == \"ms\") ? 1000 : (u == \"s\") ? 1000000 : 1; v *= m; "
                "n[f]++; s[f] += v; if (v > x[f]) x[f] = v } } "
                "END { for (f in n) printf \"TIME %s %d %.3f %.3f\\n\", f, n[f], s[f], x[f] }' "
                f"{t}/trace >&2")
        return lines

    @staticmethod
    def parse(stderr: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for line in stderr.splitlines():
            f = line.split()
            if len(f) == 3 and f[0] == "COUNT":
                out[f"trace_calls.{f[1]}"] = float(f[2])
            elif len(f) == 2 and f[0] == "SKIP":
                out[f"trace_skipped.{f[1]}"] = 1.0
            elif len(f) == 5 and f[0] == "TIME":
                out[f"trace_timed_calls.{f[1]}"] = float(f[2])
                out[f"trace_total_us.{f[1]}"] = float(f[3])
                out[f"trace_max_us.{f[1]}"] = float(f[4])
        return out


@dataclass(frozen=True)
class TraceFigure:
    figure: str           # calls, timed_calls, total_us, max_us
    function: str
    value: float
    per_unit: float       # per unit of work


def figures(traced: dict[str, float], units: float = 1.0) -> list[TraceFigure]:
    """`trace_calls.f` style keys (as parse() writes them) as figures, the
    skipped functions left out."""
    out = []
    for key, value in sorted(traced.items()):
        what, _, func = key.partition(".")
        if what != "trace_skipped":
            out.append(TraceFigure(what.removeprefix("trace_"), func, value, value / units))
    return out


def skipped(traced: dict[str, float]) -> list[str]:
    """The functions the guest kernel lacks or will not probe."""
    return [k.partition(".")[2] for k in sorted(traced) if k.startswith("trace_skipped.")]


class GuestTrace(BaseModel):
    """What one instrumented boot stores for a guest arm: the trace figures
    (they cover the whole trial) and the work they are per unit of."""
    trace: dict[str, float]
    units: float
    unit: str
    metrics: dict[str, float | None] = {}
    accelerator: str | None = None

    @classmethod
    def of(cls, samples: list[Sample]) -> GuestTrace:
        first = samples[0]
        return cls(trace={k: v for k, v in first.counts.items() if k.startswith("trace_")},
                   units=sum(work_units(s)[0] for s in samples), unit=work_units(first)[1],
                   metrics=first.metrics, accelerator=first.state.get("accelerator"))

    def figures(self) -> list[TraceFigure]:
        return figures(self.trace, self.units)

    @property
    def skipped(self) -> list[str]:
        return skipped(self.trace)


def guest_trace_record(samples: list[Sample]) -> dict:
    """What attribution stores of one instrumented boot, as JSON."""
    return GuestTrace.of(samples).model_dump()
