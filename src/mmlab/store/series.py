"""One arm's observations of a metric as the store reads them back: a value
per trial (the median of its samples) with its round and planned position,
what the estimators pair by round.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Series:
    """One arm's observations of a metric: a value per trial (the median of
    its samples), with the trial's round and planned position when known."""
    values: tuple[float, ...]
    rounds: tuple[int, ...] | None = None
    positions: tuple[int, ...] | None = None

    @classmethod
    def of(cls, values, rounds=None, positions=None) -> Series:
        if isinstance(values, Series):
            return values
        keep = [i for i, v in enumerate(values) if v is not None and np.isfinite(v)]

        def pick(xs: Sequence[int] | None) -> tuple[int, ...] | None:
            return tuple(int(xs[i]) for i in keep) if xs is not None else None

        return cls(tuple(float(values[i]) for i in keep), pick(rounds), pick(positions))

    def upto(self, rounds: int) -> Series:
        """The observations of the first `rounds` rounds."""
        if self.rounds is None:
            return self
        keep = [i for i, r in enumerate(self.rounds) if r < rounds]
        return Series(tuple(self.values[i] for i in keep), tuple(self.rounds[i] for i in keep),
                      tuple(self.positions[i] for i in keep) if self.positions else None)

    def by_round(self) -> dict[int, tuple[float, int | None]]:
        if self.rounds is None:
            return {}
        pos = self.positions or (None,) * len(self.values)
        return {r: (v, p) for r, v, p in zip(self.rounds, self.values, pos)}
