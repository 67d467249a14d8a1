"""Which kernel functions each workload variant reaches: the table a check
suggests parameters from, where no path of its suite ran a changed function.

A variant is a profile of the broad suite as it is, or the suite's first
profile of a workload (its template) with one of the workload's choices or
flags set otherwise (from `mmwork describe`), or a profile of a path the
suite lacks (EXTRA: the KSM move, seed 001's THP pageout, the reach
profiles) as it is.  Each was counted once by
function in a TCG guest (the plugin's per-block counts inside the timed
windows, attribution/functions.py) on one kernel, and the table keeps, for
every function any variant ran, the variants that ran it.  It is made by

    python -m mmlab.check.variants --kernel build:3ce798c85209

(the kept tiny 6.12 base) and written to variants.json beside this module;
the file names the kernel and the command.  Counting them all takes about
an hour, so `--add PROFILE...` counts only the profiles given, as they are,
and merges them into the table on its kernel (a profile counted before is
counted again, the rest kept).  Suggestions from it are for another kernel
only as good as the names match: a function renamed since is not found.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path

from mmlab.attribution.functions import function_of
from mmlab.errors import MmlabError
from mmlab.experiment import plan as experiment_plan
from mmlab.experiment.plan import Plan, with_kernels
from mmlab.track import suite as suites
from mmlab.track.suite import Tracked
from mmlab.workloads import HARNESS_PARAMS
from mmlab.workloads.build import REPO_ROOT

TABLE = Path(__file__).with_name("variants.json")
# The project's suites, wherever it is run from; the table names their
# profiles relative to the project (`shown`), as a user's checkout has them.
SUITE = REPO_ROOT / "experiments/suites/mm.toml"
# Profiles of paths it lacks: the KSM move, seed 001's THP pageout (a THP
# split), and the reach profiles (each runs functions no profile of the
# suite runs; its header says which).
EXTRA = (REPO_ROOT / "experiments/suites/ksm-rmap-move.toml",
         REPO_ROOT / "experiments/suites/pageout-thp.toml",
         *sorted((REPO_ROOT / "experiments/suites/reach").glob("*.toml")))
# Choices that move where the mapping lies, not which mm code runs it.
LEFT_OUT = frozenset({"align"})
# The harness's own parameters (every workload has them): they measure, not drive.
HARNESS = frozenset({*HARNESS_PARAMS, "no-probes", "insns", "cpu-time"})
SHOWN = 3              # suggestions per function at most
# What a variant is counted with: the functions a workload runs are the
# same in two rounds as in eight, and under TCG each round costs seconds.
QUICK = {"rounds": 2, "min-ms": 0}


@dataclass(frozen=True)
class Variant:
    profile: str                     # the suite profile it starts from
    path: str                        # that profile's file
    workload: str
    set: dict[str, str]              # what it sets otherwise ({}: the profile as it is)

    @property
    def label(self) -> str:
        changed = " ".join(f"{k}={v}" for k, v in self.set.items())
        return f"{self.profile}" + (f" with {changed}" if changed else "")


@dataclass(frozen=True)
class Table:
    kernel: str
    variants: list[Variant]
    functions: dict[str, list[int]]  # function -> the variants that ran it
    added: list[str] = field(default_factory=list)   # profiles merged in by --add

    def reaching(self, names: list[str], but: AbstractSet[str] = frozenset()) -> list[Variant]:
        """The variants that ran any of `names` (functions, without the
        compiler's suffixes), the suite's own profiles first, leaving out
        the profiles in `but` (those the check ran as they are)."""
        hits = dict.fromkeys(i for n in names for i in self.functions.get(n, []))
        found = [self.variants[i] for i in hits
                 if not (self.variants[i].profile in but and not self.variants[i].set)]
        return sorted(found, key=lambda v: (bool(v.set), v.label))[:SHOWN]


def load(path: Path = TABLE) -> Table | None:
    """The table, or None where it was never made."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return Table(data["kernel"], [Variant(**v) for v in data["variants"]], data["functions"],
                 data.get("added", []))


def profiles() -> tuple[list[Tracked], list[Tracked]]:
    """The broad suite's profiles with a window to count, and EXTRA's."""
    suite = [t for t in suites.load(SUITE).profiles if t.plan.workload.windows]
    return suite, [tracked(p) for p in EXTRA]


def tracked(path: Path) -> Tracked:
    """A profile outside the suite, read as the suite's are."""
    x = experiment_plan.load(path)
    return Tracked(name=x.profile.name, plan=x, metrics=x.profile.metrics,
                   area=x.workload.name)


def varied(t: Tracked) -> list[tuple[str, list[str]]]:
    """(parameter, its other values) of a template: each choice and flag of
    its workload it could set otherwise."""
    out = []
    for p in t.plan.workload.params:
        if p.name in LEFT_OUT or p.name in HARNESS or p.type not in ("choice", "flag"):
            continue
        now = str(t.plan.profile.params.get(p.name, p.default)).lower()
        values = list(p.choices) if p.type == "choice" else ["false", "true"]
        others = [v for v in values if v != now]
        if others:
            out.append((p.name, others))
    return out


def quick(plan: Plan) -> Plan:
    """`plan` with QUICK's values of the parameters its workload has."""
    have = {p.name for p in plan.workload.params}
    params = {**plan.profile.params, **{k: v for k, v in QUICK.items() if k in have}}
    return plan.model_copy(update={"profile": plan.profile.model_copy(
        update={"params": params})})


def plans(kernel: str) -> list[tuple[Tracked, str | None, Plan]]:
    """The plans counted (QUICK): each suite profile as it is, then the
    first of each workload (its template) with one parameter over its other
    values (an arm each), EXTRA's profiles last and as they are (a KSM
    merge takes minutes in a TCG guest), so a table cut short holds the
    suite whole."""
    suite, extra = profiles()
    firsts = {t.plan.workload.name: t for t in reversed(suite)}
    out: list[tuple[Tracked, str | None, Plan]] = [
        (t, None, with_kernels(quick(t.plan), [kernel], "variants")) for t in suite]
    for t in sorted(firsts.values(), key=suite.index):
        for name, values in varied(t):
            typed = [v == "true" if v in ("true", "false") else v for v in values]
            plan = quick(t.plan)
            plan = plan.model_copy(update={"profile": plan.profile.model_copy(
                update={"matrix": {**plan.profile.matrix, name: typed}})})
            out.append((t, name, with_kernels(plan, [kernel], "variants")))
    out += [(t, None, with_kernels(quick(t.plan), [kernel], "variants")) for t in extra]
    return out


def generate(kernel: str, results: str, out: Path) -> None:
    """Count every variant by function on `kernel`, writing the table
    after each plan that counted some (a run cut short leaves what it
    counted).  Every plan is checked, the kernel among them, before the
    store is made; a run that counted nothing is an error, and `out` (by
    default the table mmlab ships) is left as it was."""
    _count_into(Table(kernel, [], {}), plans(kernel), results, out, [])


def add(kernel: str, results: str, out: Path, paths: list[Path]) -> None:
    """Count the profiles at `paths` as they are on `kernel` and merge them
    into the table at `out`, which must have been counted on `kernel`: a
    variant counted before is replaced, every other kept.  Without a
    table, on another kernel or with a profile that does not load, nothing
    is counted."""
    table = load(out)
    if table is None:
        raise MmlabError(f"{out}: no table to add to: make one with "
                         f"python -m mmlab.check.variants --kernel {kernel}")
    if table.kernel != kernel:
        raise MmlabError(f"--kernel {kernel}: {out} was counted on {table.kernel}, "
                         "and a table holds one kernel's counts")
    todo: list[tuple[Tracked, str | None, Plan]] = [
        (t, None, with_kernels(quick(t.plan), [kernel], "variants")) for t in map(tracked, paths)]
    _count_into(table, todo, results, out, [*table.added, *(shown(str(p)) for p in paths)])


def _count_into(table: Table, todo: list[tuple[Tracked, str | None, Plan]], results: str,
                out: Path, added: list[str]) -> None:
    """Count `todo` by function on the table's kernel, merging each arm's
    variant into `table` (a profile's arms, counted as it is, are one
    variant: what any of them ran) and writing it after each plan that
    counted some.
    Every plan is checked before the store is made; counting nothing is an
    error that leaves `out` as it was."""
    from mmlab.run import driver
    from mmlab.store import Store
    from mmlab.targets import TargetPool
    from mmlab.track.session import only_functions
    here = driver.Here(TargetPool(False, print))
    for _, _, plan in todo:
        here.check(plan, True)
    store = Store(results)
    ran = dict(_ran(table))
    fresh: set[str] = set()      # counted by this run: its arms' functions join
    for t, name, plan in todo:
        started = time.monotonic()
        exp_id = store.create_experiment(plan)
        here.attribute(store, exp_id, only_functions(plan), print)
        got = store.attributions(exp_id)
        for arm in plan.arms:
            counted = got.get(arm.name, {}).get("functions")
            if counted is None:
                print(f"{t.name} {arm.name}: no counts")
                continue
            v = Variant(t.name, shown(t.plan.path), t.plan.workload.name,
                        {name: str(arm.values[name]).lower()} if name else {})
            before = ran[v.label][1] if v.label in fresh else set()
            ran[v.label] = (v, before | {function_of(f) for w in counted["windows"].values()
                                         for f, n in w.items() if n > 0})
            fresh.add(v.label)
        print(f"{t.name} {name or ''}: {len(plan.arms)} arm(s) in "
              f"{time.monotonic() - started:.0f} s", flush=True)
        if fresh:
            _write(out, table.kernel, list(ran.values()), added)
    if not fresh:
        raise MmlabError(f"no variant was counted on {table.kernel}: {out} is left as it was")


def _ran(table: Table) -> list[tuple[str, tuple[Variant, set[str]]]]:
    """The table's variants by label, each with the functions it ran."""
    ran: list[set[str]] = [set() for _ in table.variants]
    for f, ids in table.functions.items():
        for i in ids:
            ran[i].add(f)
    return [(v.label, (v, fs)) for v, fs in zip(table.variants, ran, strict=True)]


def shown(path: str) -> str:
    """A profile's file as the table names it: relative to the project
    where it lies inside it (the suites do), else as given."""
    full = Path(path).resolve()
    return str(full.relative_to(REPO_ROOT)) if full.is_relative_to(REPO_ROOT) else path


def _write(out: Path, kernel: str, ran: list[tuple[Variant, set[str]]],
           added: list[str]) -> None:
    functions: dict[str, list[int]] = {}
    for i, (_, fs) in enumerate(ran):
        for f in fs:
            functions.setdefault(f, []).append(i)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({
        "kernel": kernel, "made": time.strftime("%Y-%m-%d"),
        "command": f"python -m mmlab.check.variants --kernel {kernel}",
        **({"added": added} if added else {}),
        "variants": [vars(v) for v, _ in ran],
        "functions": {f: functions[f] for f in sorted(functions)}}, indent=0) + "\n")
    tmp.rename(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", required=True, help="the kernel to count on, e.g. a kept base")
    ap.add_argument("--results", default="variants-results", help="the store of the counts")
    ap.add_argument("-o", type=Path, default=TABLE, help="the table to write")
    ap.add_argument("--add", type=Path, nargs="+", metavar="PROFILE",
                    help="count only these profiles, as they are, into the table")
    args = ap.parse_args()
    try:
        if args.add:
            add(args.kernel, args.results, args.o, args.add)
        else:
            generate(args.kernel, args.results, args.o)
    except MmlabError as exc:
        raise SystemExit(f"mmlab: {exc}") from exc


if __name__ == "__main__":
    main()
