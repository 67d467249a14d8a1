"""What the judge reads: an experiment's samples trial by trial, and one
arm's values of a metric by round.  The judge defines these records and
whatever reads trials (the store, a simulation, a test) builds them, so the
statistics never depend on where the numbers were kept.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field

import numpy as np

from mmlab.workloads.samples import Sample

# Units of figures a clock measures (durations, rates per second): emulated in a TCG guest.
CLOCK_UNITS = frozenset({"ns", "us", "ms", "s", "ops/s"})
# How a trial's kernel ran, as its target records it in the samples' state
# (`accelerator`), for those that bare-metal trials use: on the machine
# itself, or on a TCG guest standing in for one (targets/simulated.py),
# whose clock is as emulated as any TCG guest's.
BARE_METAL = "bare-metal"
SIMULATED_BARE_METAL = "bare-metal (simulated: TCG guest)"
EMULATED = frozenset({"tcg", SIMULATED_BARE_METAL})


def tcg_arms(by_arm: Mapping[str, Sequence[Sample]]) -> set[str]:
    """The arms some of whose samples ran under TCG (in a guest, or on a
    simulated bare-metal machine), as the target recorded it in their state."""
    return {arm for arm, ss in by_arm.items()
            if any(s.state.get("accelerator") in EMULATED for s in ss)}


def emulated(unit: str, arms: Iterable[str], tcg: Set[str]) -> bool:
    """Whether a figure of `arms` is emulated time: measured by a clock on
    an arm that ran in a TCG guest (`tcg`, tcg_arms), where time can move
    the other way from hardware time on fault-heavy paths.  Instruction
    counts (unit insns) are exact there, so they are never emulated."""
    return unit in CLOCK_UNITS and any(a in tcg for a in arms)


@dataclass(frozen=True)
class Observations:
    """One arm's observations of a metric: a value per trial (the median of
    its samples), with the trial's round and planned position when known;
    what the estimators pair by round."""
    values: tuple[float, ...]
    rounds: tuple[int, ...] | None = None
    positions: tuple[int, ...] | None = None

    @classmethod
    def of(cls, values, rounds=None, positions=None) -> Observations:
        if isinstance(values, Observations):
            return values
        keep = [i for i, v in enumerate(values) if v is not None and np.isfinite(v)]

        def pick(xs: Sequence[int] | None) -> tuple[int, ...] | None:
            return tuple(int(xs[i]) for i in keep) if xs is not None else None

        return cls(tuple(float(values[i]) for i in keep), pick(rounds), pick(positions))

    def upto(self, rounds: int) -> Observations:
        """The observations of the first `rounds` rounds."""
        if self.rounds is None:
            return self
        keep = [i for i, r in enumerate(self.rounds) if r < rounds]
        return Observations(tuple(self.values[i] for i in keep),
                            tuple(self.rounds[i] for i in keep),
                            tuple(self.positions[i] for i in keep) if self.positions else None)

    def by_round(self) -> dict[int, tuple[float, int | None]]:
        if self.rounds is None:
            return {}
        pos = self.positions or (None,) * len(self.values)
        return {r: (v, p) for r, v, p in zip(self.rounds, self.values, pos)}


@dataclass(frozen=True)
class TrialSamples:
    """One finished trial's samples and where it stood in the plan."""
    arm: str
    round: int | None
    position: int | None
    samples: tuple[Sample, ...]
    slot: int | None = None          # position within its round


@dataclass
class Measurements:
    """The samples of an experiment trial by trial, and how far its plan has got."""
    arms: list[str]
    trials: list[TrialSamples]      # trials with samples, in planned order
    rounds: int = 0                 # rounds in the stored plan
    pending: int = 0                # trials planned or running
    seconds: float = 0.0            # time the finished trials took, start to end
    finished: int = 0               # trials done or failed
    # Per arm, its counts by function from each saved boot, where its
    # attribution made them: state index -> window -> function -> per unit.
    functions: dict[str, dict[str, dict[str, dict[str, float]]]] = field(default_factory=dict)

    @classmethod
    def of(cls, by_arm: Mapping[str, list[Sample]]) -> Measurements:
        """Samples without their rounds (each its own trial): judged unpaired."""
        return cls(list(by_arm), [TrialSamples(arm, None, None, (s,))
                                  for arm, ss in by_arm.items() for s in ss])

    @property
    def by_arm(self) -> dict[str, list[Sample]]:
        out: dict[str, list[Sample]] = {a: [] for a in self.arms}
        for t in self.trials:
            out.setdefault(t.arm, []).extend(t.samples)
        return out

    def observations(self, arm: str, metric: str) -> Observations:
        """One value per trial of `arm`: the median of its samples' `metric`
        (samples of one process are not independent observations)."""
        values, rounds, positions = [], [], []
        for t in self.trials:
            if t.arm != arm:
                continue
            xs = [x for x in (s.metrics.get(metric) for s in t.samples)
                  if x is not None and math.isfinite(x)]
            if xs:
                values.append(float(statistics.median(xs)))
                rounds.append(t.round)
                positions.append(t.position)
        known_rounds = [r for r in rounds if r is not None]
        known_positions = [p for p in positions if p is not None]
        if len(known_rounds) < len(rounds) or len(known_positions) < len(positions):
            return Observations(tuple(values))
        return Observations(tuple(values), tuple(known_rounds), tuple(known_positions))
