"""Trials on bare metal, LKP's way: an agent on the machine's base kernel
kexecs into each trial's kernel, which runs the trial at the machine's own
speed with the /init, mmwork and result frames a guest uses and kexecs back
(kexec.py).  This target asks the agent for one trial at a time over the
machine's serial channel (agentlink.py) and labels the samples with where
they ran and what the kernel switches cost.

A profile sends its arms here with `bare_metal = true`; $MMLAB_BARE_METAL
(or a fleet worker's `--bare-metal`) names the machine: a machine file
(realmachine.py: a real machine's serial line, library disk and power
control), or `simulated:KERNEL` (simulated.py): a TCG guest of KERNEL
standing in for a machine, whose figures are emulated and say so.  The
machine starts with the first trial that needs it and stops when the
target is released: after each batch the runner hands over, or when a
fleet worker's queue runs dry; a failed trial power cycles it, so every
trial starts from the base kernel's agent.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from mmlab.errors import MmlabError
from mmlab.experiment.plan import Arm, Plan
from mmlab.experiment.profile import KERNEL_NAME
from mmlab.kernels import images
from mmlab.machine import cpufreq
from mmlab.targets import LocalTarget, TrialError, TrialResult, agentlink, realmachine
from mmlab.targets.agentlink import Link, Switch, Watchdog
from mmlab.targets.boot import Guest, QemuExit, result
from mmlab.targets.qemu import guest_samples, trial_script
from mmlab.targets.realmachine import RealMachine
from mmlab.targets.simulated import SimulatedMachine
from mmlab.workloads import insns
from mmlab.workloads.mmwork import TrialFailed
from mmlab.workloads.samples import Sample

ENV = "MMLAB_BARE_METAL"
SIMULATED = re.compile(r"^simulated:(.+)$")


class Machine(Protocol):
    """A bare-metal machine as the target sees it."""
    name: str
    accelerator: str      # what its samples say they ran on
    why: str
    cmdline: str          # what every kernel kexec'd there is told (its console...)

    def base(self) -> images.Kernel:
        """Its base kernel; MmlabError when the machine cannot be had."""

    def start(self, kernels: Sequence[images.Kernel]) -> tuple[Link, dict[str, str]]:
        """Its agent ready, with `kernels` on its disk: the agent's channel,
        and each kernel's entry in the disk's library, by kernel name."""

    def console(self) -> str:
        """What its serial console printed since it started ("" where none is read)."""

    def failure(self, since: int) -> str:
        """A panic or oops on its console after offset `since`, in words."""

    def stop(self) -> None:
        """The agent ended, or the machine power cycled if it was amid a trial."""

    def environment(self) -> dict[str, object]:
        """What every trial on it records about it."""


def machine(say: Callable[[str], None], spec: str | None = None) -> Machine:
    """The machine `spec` names, $MMLAB_BARE_METAL when none is given (a
    fleet worker's --bare-metal, read from that variable too, is passed in);
    missing or bad input is refused in one line, before any trial."""
    spec = os.environ.get(ENV, "") if spec is None else spec
    found = SIMULATED.match(spec)
    base = found.group(1) if found else ""
    if not spec:
        raise MmlabError(f"bare_metal = true: name the machine in ${ENV}: its machine file "
                         "(box1.toml), or simulated:debian:6.12, a TCG guest standing in for one")
    if realmachine.is_file(spec):
        return RealMachine(realmachine.load(Path(spec)), say)
    if not KERNEL_NAME.match(base) or base == "host":
        raise MmlabError(f"{ENV}={spec!r}: expected a machine file (NAME.toml) or "
                         "simulated:KERNEL, a TCG guest of KERNEL (debian:6.12, say) standing "
                         "in for the machine")
    return SimulatedMachine(base, say)


class BareMetalTarget(LocalTarget):
    """Every bare-metal arm of a run, whatever its kernel: one machine."""

    name = "bare-metal"

    def __init__(self, machine: Machine, say: Callable[[str], None] = print):
        self.machine = machine
        self.say = say
        self.kernels: dict[str, images.Kernel | MmlabError] = {}
        self.entries: dict[str, str] = {}      # kernel name -> its entry on the disk
        self.link: Link | None = None

    def check(self, plan: Plan) -> None:
        """Refuse what bare metal cannot run yet; have the machine's base
        kernel and every arm's kernel ready (an arm whose Debian kernel
        cannot be fetched fails its trials, as a guest's does; a local or
        build kernel the cache lacks is refused, since nothing can fetch it)."""
        refuse(plan)
        for arm in plan.arms:
            if arm.bare_metal:
                images.fetchable(arm.kernel)
        self.machine.base()
        for arm in plan.arms:
            if arm.bare_metal and isinstance(self._kernel(arm.kernel), MmlabError):
                self.say(f"{self.name}: {self.kernels[arm.kernel]}; its trials will fail")

    def _kernel(self, name: str) -> images.Kernel | MmlabError:
        if name not in self.kernels:
            self.kernels[name] = images.ready(name, self.say)
        return self.kernels[name]

    def run_trial(self, arm: Arm, plan: Plan) -> TrialResult:
        """One trial kexec'd into the arm's kernel; a failed one power cycles
        the machine, so that the next starts from the base kernel's agent."""
        append = f"{self.machine.cmdline} {plan.profile.cmdline}".strip()
        kernel = self._kernel(arm.kernel)
        if isinstance(kernel, MmlabError):
            raise TrialError(str(kernel), self.machine.environment())
        guest = Guest(kernel, timeout_s=plan.profile.timeout_s, extra_cmdline=plan.profile.cmdline)
        try:
            samples, switch = self._kexeced(guest, arm, plan, append)
        except MmlabError as exc:
            env = self._environment(kernel, append, arm)
            self.release()
            raise TrialError(str(exc), env) from exc
        label(samples, self.machine, kernel, switch)
        return TrialResult(samples, {**self._environment(kernel, append, arm),
                                     **switch.figures()})

    def _environment(self, kernel: images.Kernel, append: str, arm: Arm) -> dict[str, object]:
        """The machine, as it last started, the kernel the trial kexec'd into,
        and the CPU clock that kernel set (none is known where it set none)."""
        clock = {"governor": arm.settings.governor, "turbo": arm.settings.turbo}
        return {**self.machine.environment(),
                **kexec_environment(kernel, append, arm.settings.swap),
                **{key: value for key, value in clock.items() if value}}

    def _kexeced(self, guest: Guest, arm: Arm, plan: Plan,
                 append: str) -> tuple[list[Sample], Switch]:
        """One trial under the arm's kernel and back: its samples and the
        switches' cost; a machine that fails it says how, with its console.
        A machine up without the arm's kernel on its disk (a fleet worker's
        next experiment) is started again with the plan's kernels."""
        link = self.link if self.link and arm.kernel in self.entries else self._start(plan)
        since = len(self.machine.console())
        script = trial_script(plan.workload, arm.params, plan.profile.samples_per_trial,
                              plan.profile.warmups, arm.settings, kernel=guest.kernel,
                              before=tuple(cpufreq.script(arm.settings.governor,
                                                          arm.settings.turbo)))
        try:
            results, switch = agentlink.trial(link, self.entries[arm.kernel], append, script,
                                              time.monotonic() + guest.timeout_s)
        except TrialFailed as exc:
            late = (f"not back within timeout_s = {guest.timeout_s:g}: "
                    if isinstance(exc, Watchdog) else "")
            seen = self.machine.failure(since)
            raise TrialFailed(f"{guest.kernel.name} on {self.machine.name}: {late}{exc}"
                              + (f"; {seen}" if seen else "")) from exc
        boot = result(guest, self.machine.console()[since:], results,
                      QemuExit(0, "", False, switch.trial_s))
        return guest_samples(boot, guest, plan.workload, plan.profile.samples_per_trial)[0], \
            switch

    def _start(self, plan: Plan) -> Link:
        """The machine started with every kernel of the plan's bare-metal arms
        (stopped first if it was up with others)."""
        if self.link:
            self.release()
        ready = {name: k for name in sorted({a.kernel for a in plan.arms if a.bare_metal})
                 if isinstance(k := self._kernel(name), images.Kernel)}
        self.say(f"{self.name}: starting {self.machine.name}")
        self.link, self.entries = self.machine.start(list(ready.values()))
        return self.link

    def release(self) -> None:
        """The machine stopped (power cycled amid a trial): nothing of it
        outlives a batch, or a fleet worker's queue."""
        self.machine.stop()
        self.link = None

    def attribute(self, arm: Arm, plan: Plan) -> dict[str, dict]:
        """No attribution runs on bare metal yet: said, and none stored."""
        self.say(f"{arm.name}: no attribution on bare metal yet")
        return {}


def refuse(plan: Plan) -> None:
    """What no bare-metal machine runs yet, refused before anything is
    stored: here, or by a fleet's coordinator for its bare-metal machines."""
    if plan.workload.kind == "exec":
        raise MmlabError("bare_metal = true: exec workloads do not run on bare metal yet "
                         "(their programs would have to reach the machine's disk)")
    if insns.wanted(plan.workload, plan.profile.metrics):
        raise MmlabError("bare_metal = true: instructions are not counted on bare metal yet")


def kexec_environment(kernel: images.Kernel, append: str, swap: str | None) -> dict[str, object]:
    """The kernel a trial kexec'd into, as a guest's environment names its kernel."""
    return {"kexec_kernel": kernel.name, "kexec_kernel_version": kernel.version,
            "kexec_kernel_source": kernel.source,
            "kexec_kernel_package_version": kernel.package_version,
            "kexec_kernel_suite": kernel.suite, "kexec_config_sha256": kernel.config_sha256,
            "cmdline": append, "swap": ["/dev/zram0"] if swap and swap != "none" else []}


def label(samples: list[Sample], machine: Machine, kernel: images.Kernel,
          switch: Switch) -> None:
    """Where each sample ran, never more than the truth: the machine (a
    simulated one says it was a TCG guest), its kernel, and the switches."""
    for s in samples:
        s.state.update({"target": "bare-metal", "accelerator": machine.accelerator,
                        "accelerator_why": machine.why, "machine": machine.name,
                        "kexec_kernel": kernel.name,
                        "kexec_kernel_package": kernel.package_version or kernel.version,
                        "instrumented": 0.0, **switch.figures()})
