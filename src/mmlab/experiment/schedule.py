"""The schedule: every arm once per round, each round shuffled by the seed,
so slow drift of a noisy machine spreads over all arms instead of biasing
one; reproducible, and extended round by round by adaptive looks.
"""

from __future__ import annotations

import random


def schedule(arm_names: list[str], repetitions: int, seed: int,
             start: int = 0) -> list[tuple[int, str]]:
    """Every arm once per round, each round shuffled by the seed: reproducible.
    Rounds `start`..`repetitions`-1 of the same sequence are the rounds an
    adaptive run adds, so a plan extended look by look is the plan that would
    have been drawn whole."""
    rng = random.Random(seed)
    order = []
    for rnd in range(repetitions):
        names = list(arm_names)
        rng.shuffle(names)
        if rnd >= start:
            order += [(rnd, n) for n in names]
    return order
