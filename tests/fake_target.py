"""A target that runs nothing: each trial's samples come from a seeded model
(a per-arm factor times lognormal noise), so runner, store, verdict and
report tests run in milliseconds and without touching the machine."""

from __future__ import annotations

import zlib

import numpy as np

from mmlab.experiment.plan import CPU_TIME, Arm, Plan
from mmlab.targets import LocalTarget, TargetPool, TrialError, TrialResult, probe
from mmlab.workloads import insns
from mmlab.workloads.samples import Sample

RUSAGE = {"user_s": 0.01, "sys_s": 0.02, "minflt": 10.0, "majflt": 0.0, "nvcsw": 1.0,
          "nivcsw": 0.0}


class FakeTarget(LocalTarget):
    """`factors[arm]` scales every metric of that arm; `fail` names arms whose
    trials fail; `cv` is the trial-to-trial noise; `model(arm)`, if given,
    returns (factor, extra state) for an arm: a kernel that changes the page
    state, say; the factor may be a function of the metric's name (a kernel
    slower in time whose instructions did not change)."""
    name = "fake"

    def __init__(self, factors: dict[str, float] | None = None, fail: set[str] = frozenset(),
                 cv: float = 0.01, seed: int = 1, model=None):
        self.factors = factors or {}
        self.fail = fail
        self.cv = cv
        self.rng = np.random.default_rng(seed)
        self.trials: list[str] = []
        self.checked = 0
        self.model = model

    def check(self, plan: Plan) -> None:
        self.checked += 1

    def run_trial(self, arm: Arm, plan: Plan) -> TrialResult:
        self.trials.append(arm.name)
        env = {**probe.environment(), "target": "fake"}
        if arm.name in self.fail:
            raise TrialError(f"{arm.name}: failed on purpose", env)
        factor, state = self.model(arm) if self.model else (self.factors.get(arm.name, 1.0), {})
        scale = factor if callable(factor) else lambda name: factor
        # Instruction metrics only where the profile asks for counts, and CPU
        # time where its arms ask for it, as the real targets.
        wl = plan.workload
        counted = insns.wanted(wl, plan.profile.metrics)
        alone = insns.only(wl, plan.profile.metrics)
        metrics = {m.name: 100.0 * (1 + zlib.crc32(m.name.encode()) % 7) * scale(m.name)
                   * float(self.rng.lognormal(0, self.cv)) for m in wl.metrics
                   if (counted or m.name not in wl.window_metrics())
                   and (not alone or m.name in wl.window_metrics())
                   and (arm.params.get(CPU_TIME) or m.name not in wl.cpu_metrics())}
        samples = [Sample(workload=plan.workload.name, sample=i, mmwork_version="fake",
                          params={k: v for k, v in arm.params.items()}, metrics=metrics,
                          counts={"pages": 4096.0}, rusage=RUSAGE, vmstat_delta={},
                          state={"target": "fake", **state}, errors={})
                   for i in range(plan.profile.samples_per_trial)]
        return TrialResult(samples, env)

    def attribute(self, arm: Arm, plan: Plan) -> dict[str, dict]:
        return {}


def fake_pool(fake: FakeTarget) -> TargetPool:
    """A pool whose every arm runs on one FakeTarget."""
    return TargetPool(make=lambda arm: fake)
