"""What a check is asked, read and checked whole before anything is built,
fetched or stored: the series (series.read: format-patch files or an mbox,
in order), the base (a Debian source series the catalog has, or a kernel
tree), the config its kernels start from (Debian's, by default) and the
profiles (a suite's, or profiles given one by one), each
measured on counts.

A check measures kernel instructions alone: they are exact in a TCG guest,
where times are emulated, so a profile is measured on its counted metrics
(its windows' kernel instructions where it names none) and on every
syscall's, fault's and exception's path its counting pass stores.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from mmlab.check import variants
from mmlab.errors import MmlabError
from mmlab.experiment import plan as experiment_plan
from mmlab.kernels import catalog, kbuild, kconfig, series, versions
from mmlab.kernels.series import Patch
from mmlab.machine import proc
from mmlab.track import session
from mmlab.track import suite as suites
from mmlab.track.suite import Tracked


@dataclass(frozen=True)
class Request:
    patches: list[Patch]
    inputs: list[Path]             # the files given (format-patch files or one mbox)
    base: str                      # debian-source:SERIES or a kernel tree
    profiles: list[Tracked]        # each with its counted metrics
    suite: str                     # the suite's name, or "profiles"
    given: str                     # the series and base as a command line gives them
    skipped: list[str] = field(default_factory=list)   # a suite's profiles with nothing to count
    config: str = kconfig.DEFAULT  # where the kernels' config starts (kconfig.NAMES)


def read(inputs: list[Path], base: str | None, suite: Path | None,
         profiles: list[Path], given: str | None = None,
         config: str = kconfig.DEFAULT) -> Request:
    """The request, every part checked (one line naming the file, key or
    value that is wrong); nothing is made.  `given`: how a command line
    names the series and base, where not as files and --base (a tree's
    commits).  A Debian source's config is looked up in the catalog here; a
    tree's needs the tree's release, which the build reads first thing."""
    if not inputs:
        raise MmlabError("check: no patches given (format-patch files, one mbox, or --tree "
                         "DIR --commits OLD..NEW)")
    if suite is not None and profiles:
        raise MmlabError("check: give --suite or --profile, not both")
    patches = series.read(inputs)
    kconfig.check_name(config)
    base = base or newest_base()
    check_base(base)
    if base.startswith("debian-source:"):
        kbuild.config_image(config, base)
    skipped: list[str] = []
    if profiles:
        tracked, name = [_profile(p) for p in profiles], "profiles"
    else:
        found = suites.load(suite or variants.SUITE)
        tracked = [_counted(t, Path(found.path)) for t in found.profiles if countable(t)]
        skipped = [t.name for t in found.profiles if not countable(t)]
        if not tracked:
            raise MmlabError(f"{found.path}: no profile of suite {found.name} has a window "
                             "whose kernel instructions can be counted (a check measures "
                             "counts)")
        name = found.name
    given = given or " ".join([*map(str, inputs), "--base", base])
    return Request(patches, list(inputs), base, tracked, name,
                   given + ("" if config == kconfig.DEFAULT else f" --config {config}"), skipped,
                   config)


def countable(t: Tracked) -> bool:
    """A profile whose workload has a window to count."""
    return bool(t.plan.workload.windows and session.class_metrics(t, "counts"))


def from_commits(tree: Path, rev_range: str, scratch: Path,
                 config: str) -> tuple[list[Path], str]:
    """The commits OLD..NEW of a kernel git tree as format-patch files in
    `scratch` (a temporary folder the caller removes), and OLD's commit:
    the base is the tree at OLD, checked out when the kernels are built, so
    the Debian config OLD's release needs is looked up here, from OLD's
    Makefile as git has it, before anything is checked out."""
    if not (tree / "Makefile").is_file() or not (tree / "Kconfig").is_file():
        raise MmlabError(f"--tree {tree}: not a kernel source tree (no Makefile and Kconfig)")
    inside = proc.call(["git", "-C", str(tree), "rev-parse", "--is-inside-work-tree"],
                       check=False)
    if inside.returncode or inside.stdout.strip() != "true":
        raise MmlabError(f"--tree {tree}: not a git tree (--commits needs one)")
    base = kbuild.commits(tree, rev_range)[0]
    kconfig.check_name(config)
    if kconfig.NAMES[config] is not None:
        makefile = proc.call(["git", "-C", str(tree), "show", f"{base}:Makefile"],
                             what=f"git show {base[:12]}:Makefile").stdout
        kconfig.image(config, kconfig.release_of(makefile, f"--tree {tree} at {base[:12]}"))
    proc.call(["git", "-C", str(tree), "format-patch", "-q", "--no-merges", "-o", str(scratch),
               rev_range], what=f"git format-patch {rev_range}")
    return sorted(scratch.glob("*.patch")), base


def newest_base() -> str:
    """debian-source:SERIES of the newest linux-source package the catalog has."""
    have = {r["package"].removeprefix("linux-source-") for r in catalog.Apt().catalog()
            if re.fullmatch(r"linux-source-\d+\.\d+", r["package"])}
    if not have:
        raise MmlabError("--base: the Debian catalog has no linux-source package; "
                         "give --base PATH_TO_A_KERNEL_TREE")
    return f"debian-source:{max(have, key=versions.series_key)}"


def check_base(spec: str) -> None:
    """A Debian source series the catalog has (nothing fetched), or a kernel tree."""
    if spec.startswith("debian-source:"):
        wanted = spec.removeprefix("debian-source:")
        if not re.fullmatch(r"\d+\.\d+", wanted):
            raise MmlabError(f"--base {spec}: expected debian-source:MAJOR.MINOR, "
                             "e.g. debian-source:6.12")
        try:
            kbuild.debian_source(wanted)
        except MmlabError as exc:
            raise MmlabError(f"--base {exc}") from exc
        return
    tree = Path(spec)
    if not (tree / "Makefile").is_file() or not (tree / "Kconfig").is_file():
        raise MmlabError(f"--base {spec}: neither debian-source:SERIES nor a kernel source tree "
                         "(no Makefile and Kconfig)")


def _profile(path: Path) -> Tracked:
    plan = experiment_plan.load(path)
    if plan.profile.arms:
        raise MmlabError(f"--profile {path}: a check needs a [matrix] profile, not [[arms]]")
    return _counted(Tracked(name=plan.profile.name, plan=plan, metrics=plan.profile.metrics,
                            area=plan.workload.name), path)


def _counted(t: Tracked, where: Path) -> Tracked:
    """The profile with its counted metrics only, and its first window's
    page faults named, so that the counting pass counts every syscall's,
    fault's and exception's path (the check judges each); one with nothing
    to count (no timed window) is refused when given alone."""
    if not countable(t):
        raise MmlabError(f"{where}: profile {t.name}: {t.plan.workload.name} has no window "
                         "whose kernel instructions can be counted (a check measures counts)")
    stays = f"{t.plan.workload.windows[0].name}_fault_calls"
    metrics = session.class_metrics(t, "counts")
    return t.model_copy(update={"metrics": list(dict.fromkeys([*metrics, stays]))})


def patch_files(request: Request, scratch: Path) -> list[Path]:
    """One file per patch for the build: the file given where it holds that
    patch alone (so a build of it is found in the cache by its bytes),
    else the patch written out of the mbox into `scratch` (a temporary
    folder the caller removes: the build's cache key is the patch's bytes,
    never its path)."""
    given = {name: f for f in request.inputs for name in (str(f), f.name)}
    if len(request.inputs) == len(request.patches) and all(p.origin in given
                                                            for p in request.patches):
        return [given[p.origin] for p in request.patches]
    out = []
    for p in request.patches:
        path = scratch / f"{p.number:04d}.patch"
        path.write_text(f"Subject: [PATCH {p.number}/{p.total}] {p.subject}\n\n---\n{p.diff}")
        out.append(path)
    return out
