"""The package's shape, read from its source: stages import only earlier
stages (a type-only import, under `if TYPE_CHECKING:`, never runs and may
name any stage), modules stay small, the command layer stays thin, and the C
harness has no include loops."""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "mmlab"

# The stages, lowest first: a module may import its own stage and lower ones.
STAGES = [
    {"errors", "names", "environ"},
    {"machine"},
    {"workloads"},
    {"kernels"},
    {"experiment"},
    {"judge"},
    {"store"},
    {"attribution"},
    {"targets"},
    {"run"},
    {"fleet", "census"},
    {"track", "check"},
    {"report"},
    {"bench", "cli"},
]
LEVEL = {name: i for i, names in enumerate(STAGES) for name in names}


def stage_of(module: str) -> str | None:
    """'mmlab.judge.stats' -> 'judge'; the package's own __init__ -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "mmlab" else None


def imported(path: Path, run_only: bool = False) -> set[str]:
    """The mmlab modules a file imports, by absolute name; `run_only`: only
    the imports that run, not those under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for n in _type_only(tree)} if run_only else set()
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("mmlab")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mmlab"):
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


def _type_only(tree: ast.AST) -> list[ast.AST]:
    """Every node under an `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`)."""
    return [n for block in ast.walk(tree)
            if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING")
            for stmt in block.body for n in ast.walk(stmt)]


def sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if p.parent != SRC or p.name != "__init__.py")


def test_every_module_belongs_to_a_stage():
    stages = {p.relative_to(SRC).parts[0].removesuffix(".py") for p in sources()}
    assert stages <= set(LEVEL) | {"__init__"}, stages - set(LEVEL)


def test_stages_import_only_earlier_stages():
    bad = []
    for path in sources():
        mine = path.relative_to(SRC).parts[0].removesuffix(".py")
        for module in imported(path, run_only=True):
            theirs = stage_of(module)
            if theirs in LEVEL and LEVEL[theirs] > LEVEL[mine]:
                bad.append(f"{path.relative_to(SRC)} imports {module}")
    assert not bad, "\n".join(sorted(bad))


def test_attribution_and_reports_depend_one_way():
    """Attribution returns data and never imports a report; reports render
    stored data and never import collection or the targets."""
    for path in (SRC / "attribution").glob("*.py"):
        assert not {m for m in imported(path) if m.startswith("mmlab.report")}, path
    for path in (SRC / "report").rglob("*.py"):
        bad = {m for m in imported(path)
               if m.startswith(("mmlab.attribution.collect", "mmlab.targets"))}
        assert not bad, (path, bad)


def test_modules_are_small_and_the_commands_thin():
    long = [f"{p.relative_to(SRC)}: {n}" for p in sources()
            if (n := len(p.read_text().splitlines())) > 500]
    assert not long, long
    cli = [f"{p.name}: {n}" for p in (SRC / "cli").glob("*.py")
           if (n := len(p.read_text().splitlines())) > 400]
    assert not cli, cli


def test_the_c_harness_has_no_include_loops():
    """A .c file that includes core-x.h depends on core-x.c: no cycles."""
    graph: dict[str, set[str]] = {}
    for path in (ROOT / "workloads").glob("*.[ch]"):
        unit = path.stem
        deps = {Path(h).stem for h in re.findall(r'#include "([^"]+)"', path.read_text())}
        graph.setdefault(unit, set()).update(deps - {unit})
    graphlib.TopologicalSorter(graph).prepare()      # CycleError names the loop


def test_commands_run_experiments_only_through_the_driver():
    """The command layer parses and renders: it never imports the runner or
    the fleet's coordinator (driver.run_experiment wires them), and never
    assigns to another object's attributes (a pool's `say` mid-run, say):
    progress reaches it through the one listener it handed over.  An
    object's own `self.x` is its business."""
    bad = []
    for path in (SRC / "cli").glob("*.py"):
        tree = ast.parse(path.read_text())
        bad += [f"{path.name} imports {m}" for m in imported(path)
                if m.startswith(("mmlab.run.runner", "mmlab.fleet.coordinator.run"))]
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            bad += [f"{path.name}:{node.lineno} assigns {ast.unparse(t)}" for t in targets
                    if isinstance(t, ast.Attribute) and not t.attr.startswith("__")
                    and ast.unparse(t.value) != "self"]
    assert not bad, "\n".join(bad)


def test_the_command_layer_starts_without_the_library():
    """`mmlab --version`, `--help` and a typo's one-line error must not wait
    for the statistics, pydantic or rich to import: the command modules
    import the library inside the command that uses it.  (How long a start
    takes is a `make bench` figure, not a test.)"""
    import subprocess
    import sys
    heavy = ("scipy", "numpy", "pydantic", "matplotlib", "rich.progress", "ruptures",
             "mmlab.store", "mmlab.judge", "mmlab.report")
    found = subprocess.run(
        [sys.executable, "-c", "import sys, mmlab.cli; "
         f"print(' '.join(m for m in {heavy!r} if m in sys.modules))"],
        capture_output=True, text=True, check=True).stdout.split()
    assert not found, f"importing mmlab.cli loads {found}"
