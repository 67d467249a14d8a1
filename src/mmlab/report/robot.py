"""A patch check as maintainers read the kernel test robot's reports, in
plain text for pasting as a reply to the series: per change a subject line
(`[mm] <patch subject>: <profile>.<metric> +12.3% regression`), the base
and patched kernels (source, config hash, compiler), the machine and how
the kernels ran, a `base %stddev %change patched %stddev` table of the
profile's changed paths, the functions that moved, and how to reproduce.
With no change, one line: how many paths were checked, at what
resolution.  `record` is the same content for scripts (report/json.py
writes it)."""

from __future__ import annotations

from mmlab.attribution.explain import CallPath, WindowFunctions
from mmlab.check.coverage import Coverage, FunctionCoverage
from mmlab.check.session import CheckResult, Found
from mmlab.judge.criteria import COUNT_NOISES
from mmlab.kernels.images import Kernel
from mmlab.report import fmt
from mmlab.track.evidence import MetricRow

RULE = (f"the count rule: the two kernels' rounds apart, and the step beyond {COUNT_NOISES:g} "
        "robust CVs of their own noise and a floor")
FLOORS = {"window": "a window's kernel instructions", "path": "a syscall's or fault's path",
          "calls": "a syscall's calls"}


def subject(result: CheckResult, f: Found) -> str:
    """The robot's subject line for one change."""
    ch = f.change
    patch = result.request.patches[f.patch - 1].subject if f.patch else \
        f"{len(result.request.patches)}-patch series (not placed)"
    return f"[mm] {patch}: {ch.profile}.{ch.metric} {fmt.change(fmt.step(ch))} {ch.outcome}"


def resolution(result: CheckResult) -> str:
    """The count rule and its floors, in words."""
    floors = ", ".join(f"{FLOORS.get(kind, kind)} {floor:.2%}"
                       for kind, floor in result.floors.items())
    return f"{RULE} ({floors})"


def text(result: CheckResult) -> str:
    """The report: every change, a profile's changes from one patch
    together, then the coverage; or the one line of none (and the changed
    functions no path ran, where there are such)."""
    if not result.found:
        lines = [failed(result) or nothing(result) + covered(result), *not_measured(result)]
        return fmt.printable("\n".join(lines) + "\n", keep="\n")
    lines = []
    for group in groups(result.found):
        lines += group_lines(result, group)
    lines += coverage_lines(result)
    lines += [failed(result)] if result.failed else []
    return fmt.printable("\n".join(lines).rstrip() + "\n", keep="\n")


def failed(result: CheckResult) -> str:
    """Trials that failed (a kernel that did not boot, say): the paths they
    leave out have no verdict, so the check says none ("" when none failed)."""
    if not result.failed:
        return ""
    where = "; ".join(f"{f.profile} on {f.kernel}: {f.trials} trial(s) failed: {f.error}"
                      for f in result.failed)
    return f"mmlab check: incomplete, no verdict on the paths of trials that failed: {where}"


def groups(found: list[Found]) -> list[list[Found]]:
    """The changes of one profile brought by one patch, in the check's order."""
    by: dict[tuple[str, int | None], list[Found]] = {}
    for f in found:
        by.setdefault((f.change.profile, f.patch), []).append(f)
    return list(by.values())


def nothing(result: CheckResult) -> str:
    n = len(result.request.patches)
    also = (f"; {len(result.unconfirmed)} path(s) the first look flagged were not confirmed"
            if result.unconfirmed else "") + skipped(result)
    return (f"mmlab check: no change: {result.paths} path(s) of {len(result.request.profiles)} "
            f"profile(s) checked on counts ({result.accelerator} guests, {result.rounds} "
            f"rounds a kernel) between {result.base.name} "
            f"({result.base.details.get('source', result.base.source)}) and it with the {n} "
            f"patch(es) applied, "
            f"at the resolution of {resolution(result)}{also}")


def covered(result: CheckResult) -> str:
    """What the no-change line adds about the series' functions: those the
    paths ran (whose counts did not move), or that the series changes no
    compiled code, or only moves it ("" where nothing is known)."""
    cov = result.coverage
    if cov is None:
        return ""
    ran = ", ".join(f"{reached_name(f)} ({places(f)})" for f in cov.reached)
    said = f"; the changed functions the paths ran did not move: {ran}" if ran else ""
    if cov.layout and cov.layout.identical:
        return said + ("; the patched kernel's functions are the base's, each at its address "
                       "and size: the series changes no compiled code")
    if cov.only_moved and cov.layout:
        return said + (f"; where the paths run the series only moves code: none of the "
                       f"{cov.layout.ran} functions they ran changed size, "
                       f"{cov.layout.ran_moved} lie at new addresses (a layout change; "
                       "instruction counts do not see one)")
    return said


def reached_name(f: FunctionCoverage) -> str:
    return f.function + (f" (inlined into {', '.join(f.hosts)})" if f.hosts else "")


def places(f: FunctionCoverage) -> str:
    """The profiles and windows that ran a function, with its count."""
    return "; ".join(f"{r.profile} {r.window} {fmt.num(r.insns)}/{r.unit}" for r in f.reached)


def not_measured(result: CheckResult) -> list[str]:
    """One line per changed function no path ran, with the variants that
    run it; none where every changed function was run or cannot be."""
    cov = result.coverage
    if cov is None or not (cov.unreached or cov.unknown):
        return []
    return ["not measured: the check's paths did not run these changed functions (or it "
            "cannot tell), so no change there means not measured:",
            *(f"  {unreached_line(f, cov.table)}" for f in cov.unreached),
            *(f"  {f.function} ({f.changed.path}): not known: {f.why}" for f in cov.unknown),
            *uncounted(cov)]


def uncounted(cov: Coverage) -> list[str]:
    """The profiles whose base could not be counted by function: a function
    only they run is listed as not run."""
    return [f"  (the base could not be counted by function in {', '.join(cov.uncounted)}: "
            "what only they run is listed as not run)"] if cov.uncounted else []


def unreached_line(f: FunctionCoverage, table: str, said: str = "") -> str:
    """A changed function no path ran: its file and patches, `said`, then
    the variants of the table (counted on kernel `table`) that run it."""
    where = f"{f.changed.path}, patch {'/'.join(map(str, f.changed.patches))}"
    hint = ("; run by " + ", ".join(v.label for v in f.suggestions)) if f.suggestions \
        else f"; no workload variant counted on {table} runs it" if table else ""
    return f"{reached_name(f)} ({where}){said}{hint}"


def coverage_lines(result: CheckResult) -> list[str]:
    """The coverage after the changes: each changed function, where the
    paths ran it on the base, or that none did, or why none can."""
    cov = result.coverage
    if cov is None or not cov.functions:
        return []
    out = [f"coverage: the functions the series changes ({cov.parser}), and the paths that "
           "ran them on the base kernel:"]
    for f in cov.functions:
        if f.reached:
            out.append(f"  {reached_name(f)} ({f.changed.path}): ran in {places(f)}")
        elif f.measurable:
            out.append(f"  {unreached_line(f, cov.table, ': no path ran it, not measured')}")
        else:
            out.append(f"  {f.function} ({f.changed.path}): {f.why}")
    return out + uncounted(cov) + [""]


def skipped(result: CheckResult) -> str:
    """The suite's profiles a check could not count, said where it says
    what it checked ("" when none)."""
    names = result.request.skipped
    return (f"; not checked, nothing to count: {', '.join(names)}" if names else "")


def group_lines(result: CheckResult, group: list[Found]) -> list[str]:
    """The subject lines of a group's changes, then what they share: the
    patch, the kernels, the machine, the table, the functions, the commands."""
    out = [subject(result, f) for f in group] + [""]
    out += [f"mmlab check noticed a {fmt.change(fmt.step(f.change))} {f.change.outcome} of "
            f"{f.change.profile}.{f.change.metric}" for f in group]
    out += ["on:", "", *about(result, group), ""]
    out += table(rows(group))
    out += functions(group)
    if group[0].narrowing:
        out += ["", "the patch, by bisection over the series' kernels:"]
        out += [f"  {line.strip()}" for line in group[0].narrowing]
    out += ["", "to reproduce:"]
    out += [f"  {cmd}" for cmd in group[0].evidence.commands.values()]
    out.append(f"  ({BUNDLE})")
    return out + ["", ""]


PATHS = 3          # a window's syscall paths shown where no changed metric names one
BUNDLE = "the bundle holds reproducer.c, a standalone C program of the workload"


def about(result: CheckResult, group: list[Found]) -> list[str]:
    """The patch, the kernels, the machine, what a count counts and how the
    change was decided."""
    first = group[0]
    if first.patch:
        p = result.request.patches[first.patch - 1]
        patch = f"[PATCH {p.number}/{p.total}] {p.subject}" + (f" ({p.author})" if p.author
                                                                else "")
    else:
        patch = "the whole series (the bisection did not place it)"
    return [f"patch:    {patch}",
            f"base:     {kernel_line(result.base)}",
            f"patched:  {kernel_line(result.patched)}",
            f"machine:  {machine_line(result)}",
            f"counts:   {fmt.COUNTED}, {fmt.COUNTED_BY['plugin']}",
            f"decided:  first look {result.rounds} rounds a kernel, confirmed in "
            f"{first.evidence.rounds} fresh rounds, interleaved, by {resolution(result)}"
            f"{skipped(result)}"]


def rows(group: list[Found]) -> list[MetricRow]:
    """The table's rows: each change's path on both kernels."""
    by_metric = {m.metric: m for f in group for m in f.evidence.metrics}
    return [by_metric[f.change.metric] for f in group if f.change.metric in by_metric]


def functions(group: list[Found]) -> list[str]:
    """The functions that moved in the windows of the group's paths: each
    window's, exclusive, and each syscall's path, inclusive."""
    out = []
    for wf in [w for w in group[0].evidence.functions
               if any(f.change.metric.startswith(f"{w.window}_") for f in group)]:
        moved = ", ".join(f"{r.label} {fmt.signed(r.change)}" for r in wf.rows[:6]) or \
            "no change"
        out.append(f"functions ({wf.window}, kernel instructions per {wf.unit}, exclusive): "
                   f"{moved}")
        out += [f"  {fmt.call_path(p, wf.unit, 4)}" for p in paths(wf, group)]
    return out


def paths(wf: WindowFunctions, group: list[Found]) -> list[CallPath]:
    """The syscall paths (inclusive) the group's changed metrics name; for
    a window's whole count, the PATHS that moved most.  A window that runs a
    whole command has a path per syscall it made, most of them moved by
    what else ran: those say nothing of the change."""
    named = [p for p in wf.paths if any(f"_{p.stay}_" in f.change.metric for f in group)]
    if named:
        return named
    moved = [p for p in wf.paths if p.per_unit_baseline is not None
             and p.per_unit != p.per_unit_baseline]
    return sorted(moved, key=lambda p: -abs(p.per_unit - (p.per_unit_baseline or 0)))[:PATHS]


def kernel_line(k: Kernel) -> str:
    """The kernel, its source, which config it was built with (a build's
    says how it stands to Debian's) and its hash, and the compiler."""
    source = k.details.get("source", k.source)
    config = f"{k.details['config']}, " if k.details.get("config") else ""
    return (f"{k.name} {k.version}, source {source}, config {config}sha256 "
            f"{k.config_sha256[:12]}, compiler {k.details.get('compiler', 'unknown')}")


def machine_line(result: CheckResult) -> str:
    m = result.machine
    return (f"{m.get('cpu_model', '?')}, {m.get('cpus', '?')} CPUs, {m.get('memory', '?')}; "
            f"the kernels ran in QEMU guests ({result.accelerator})")


def table(rows: list[MetricRow]) -> list[str]:
    """The robot's table: base, its spread, the change, patched, its spread."""
    out = [f"{'base':>16} {'%stddev':>8} {'%change':>9} {'patched':>16} {'%stddev':>8}",
           f"{'-' * 16} {'-' * 8} {'-' * 9} {'-' * 16} {'-' * 8}"]
    for m in rows:
        out.append(f"{fmt.num(m.before):>16} {'±' + fmt.spread(m.spread_before):>8} "
                   f"{fmt.change(m.ratio):>9} {fmt.num(m.after):>16} "
                   f"{'±' + fmt.spread(m.spread_after):>8}  {m.metric} ({m.outcome})")
    return out + [""]


def record(result: CheckResult) -> dict:
    """The same content for scripts."""
    return {
        "changed": result.changed, "paths": result.paths, "rounds": result.rounds,
        "accelerator": result.accelerator, "machine": result.machine,
        "resolution": resolution(result), "floors": result.floors,
        "base": _kernel(result.base), "patched": _kernel(result.patched),
        "patches": [{"number": p.number, "total": p.total, "subject": p.subject,
                     "author": p.author, "origin": p.origin}
                    for p in result.request.patches],
        "profiles": [t.name for t in result.request.profiles],
        "skipped": result.request.skipped,
        "changes": [{"subject": subject(result, f), "profile": f.change.profile,
                     "metric": f.change.metric, "outcome": f.change.outcome,
                     "ratio": fmt.step(f.change), "patch": f.patch,
                     "experiment": f.change.evidence,
                     "rows": [{"metric": m.metric, "base": m.before, "patched": m.after,
                               "spread_base": m.spread_before, "spread_patched": m.spread_after,
                               "ratio": m.ratio, "outcome": m.outcome}
                              for m in f.evidence.metrics],
                     "functions": [{"window": w.window, "unit": w.unit,
                                    "rows": [{"function": r.label, "change": r.change}
                                             for r in w.rows]}
                                   for w in f.evidence.functions],
                     "narrowing": f.narrowing, "commands": f.evidence.commands}
                    for f in result.found],
        "unconfirmed": [vars(u) for u in result.unconfirmed],
        "experiments": result.experiments,
        "failed": [vars(x) for x in result.failed],
        "coverage": coverage_record(result.coverage),
    }


def coverage_record(cov: Coverage | None) -> dict | None:
    """The coverage for scripts: each changed function, and the kernels'
    functions compared (counts of them, not their names)."""
    if cov is None:
        return None
    lay = cov.layout
    return {
        "parser": cov.parser, "profiles": cov.profiles, "uncounted": cov.uncounted,
        "seconds": round(cov.seconds, 1),
        "variants_kernel": cov.table,
        "functions": [{"function": f.function, "file": f.changed.path,
                       "patches": list(f.changed.patches), "code": f.changed.code,
                       "new": f.changed.new, "symbols": f.symbols, "inlined_into": f.hosts,
                       "not_countable": f.why, "resized": f.resized,
                       "reached": [vars(r) for r in f.reached],
                       "suggestions": [vars(v) for v in f.suggestions]}
                      for f in cov.functions],
        "layout": None if lay is None else {
            "resized": lay.resized, "moved": len(lay.moved), "same": lay.same,
            "ran": lay.ran, "ran_moved": lay.ran_moved, "ran_resized": lay.ran_resized,
            "identical": lay.identical, "only_moved": cov.only_moved},
    }


def _kernel(k: Kernel) -> dict:
    return {"name": k.name, "version": k.version,
            "source": k.details.get("source", k.source), "config_sha256": k.config_sha256,
            "config": k.details.get("config"), "config_start": k.details.get("config_start"),
            "compiler": k.details.get("compiler", "unknown")}
