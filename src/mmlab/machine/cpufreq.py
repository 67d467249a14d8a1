"""The CPU clock trials run at: the cpufreq governor of every online CPU, and
turbo (boost).  A CPU whose clock follows its load, or climbs above its base
while it is cool, times the same work differently from one trial to the
next, so performance labs (LKP, mmtests, pyperf's `system tune`) pin the
governor to performance and turn turbo off while they measure.

One class per tunable, as pyperf has them: `read` says what is in force (for
every trial's environment), `files` which sysfs files to write for a wanted
value, refusing in words what this machine cannot do.  Writing and putting
back are knobs': each file becomes a SettingFile, journaled before it
changes and restored by the journal like THP.  CPU is the sysfs folder read,
a constant the tests point at a fake tree.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator

from mmlab.errors import MmlabError

CPU = Path("/sys/devices/system/cpu")
NO_CPUFREQ = ("this machine has no CPU frequency driver (no cpufreq in sysfs, as in most "
              "virtual machines): its CPU clock cannot be set")


def _governor_name(value: str) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", value):
        raise ValueError("expected a cpufreq governor's name, like performance")
    return value


GovernorName = Annotated[str, AfterValidator(_governor_name)]
TurboState = Literal["off", "on"]


def _text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def online() -> list[Path]:
    """The online CPUs' folders, in CPU order (a CPU without an `online`
    file, cpu0 mostly, cannot be taken offline)."""
    cpus = [p for p in CPU.glob("cpu[0-9]*") if _text(p / "online") in ("", "1")]
    return sorted(cpus, key=lambda p: int(p.name.removeprefix("cpu")))


def has_cpufreq() -> bool:
    return any((cpu / "cpufreq").is_dir() for cpu in online())


class Governor:
    """Every online CPU's scaling_governor, set to one governor for all."""

    def read(self) -> str:
        """The governor in force; several, comma-separated, when the CPUs
        differ; "none" without cpufreq."""
        found = {_text(cpu / "cpufreq/scaling_governor") for cpu in online()} - {""}
        return ", ".join(sorted(found)) or "none"

    def files(self, name: str) -> list[tuple[str, str]]:
        """(file, value) for each online CPU, once every one offers `name`
        (its scaling_available_governors): none is changed otherwise."""
        if not has_cpufreq():
            raise MmlabError(f"governor = {name!r}: {NO_CPUFREQ}")
        for cpu in online():
            offered = _text(cpu / "cpufreq/scaling_available_governors").split()
            if name not in offered:
                raise MmlabError(f"governor = {name!r}: {cpu.name} offers "
                                 f"{', '.join(offered) or 'no governor'}")
        return [(str(cpu / "cpufreq/scaling_governor"), name) for cpu in online()]


class Turbo:
    """Clocks above the base frequency: intel_pstate's no_turbo (1 = off)
    where intel_pstate drives the CPUs, else cpufreq's boost (0 = off), which
    amd-pstate and acpi-cpufreq have."""

    SWITCHES = (("intel_pstate/no_turbo", {"off": "1", "on": "0"}),
                ("cpufreq/boost", {"off": "0", "on": "1"}))

    def _switch(self) -> tuple[Path, dict[str, str]] | None:
        return next(((CPU / name, values) for name, values in self.SWITCHES
                     if (CPU / name).exists()), None)

    def read(self) -> str:
        """"off" or "on"; "none" where there is no switch."""
        switch = self._switch()
        if switch is None:
            return "none"
        path, values = switch
        raw = _text(path)
        return next((state for state, value in values.items() if value == raw), raw or "none")

    def files(self, state: str) -> list[tuple[str, str]]:
        """(file, value) of the switch for `state`."""
        switch = self._switch()
        if switch is None:
            why = ("its CPU frequency driver has no turbo switch (intel_pstate/no_turbo or "
                   "cpufreq/boost)") if has_cpufreq() else NO_CPUFREQ
            raise MmlabError(f"turbo = {state!r}: {why}")
        path, values = switch
        return [(str(path), values[state])]


def script(governor: str | None, turbo: str | None,
           sysfs: str = "/sys/devices/system/cpu") -> list[str]:
    """Shell lines that set the CPU clock on a machine mmlab runs no Python
    on: a bare-metal machine's kernel under test, which ends with its trial,
    so nothing is put back.  What `files` refuses here fails the trial there,
    in the same words, before the workload runs."""
    if governor is None and turbo is None:
        return []
    lines = [f"ls -d {sysfs}/cpu[0-9]*/cpufreq >/dev/null 2>&1 || "
             f"{{ echo 'mmlab: {NO_CPUFREQ}' >&2; exit 1; }}"]
    if governor is not None:
        lines += [f"for c in {sysfs}/cpu[0-9]*/cpufreq; do",
                  f"  grep -qw {governor} $c/scaling_available_governors || {{ echo \"mmlab: "
                  f"governor = '{governor}': $(basename $(dirname $c)) offers "
                  f"$(cat $c/scaling_available_governors)\" >&2; exit 1; }}",
                  f"  echo {governor} > $c/scaling_governor",
                  "done"]
    if turbo is not None:
        (first, one), (second, other) = Turbo.SWITCHES
        lines += [f"if [ -e {sysfs}/{first} ]; then echo {one[turbo]} > {sysfs}/{first}",
                  f"elif [ -e {sysfs}/{second} ]; then echo {other[turbo]} > {sysfs}/{second}",
                  f"else echo 'mmlab: turbo = {turbo!r}: its CPU frequency driver has no turbo "
                  f"switch (intel_pstate/no_turbo or cpufreq/boost)' >&2; exit 1; fi"]
    return lines
