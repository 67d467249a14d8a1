"""The schedule: every arm once per round, the rounds drawn in balanced
blocks, so neither the position in a round nor the arm run just before can
favour one arm.

A trial can be slower for being first in its round (a cold cache, a guest
still settling) or for the state the trial before left behind (swap, page
cache, KSM).  A shuffle per round leaves these to chance: with 25 rounds one
seed put the baseline first in 15 of them, and a rerun of the profile repeats
the same schedule.  So the rounds come in blocks of a Williams design
(Williams 1949): in a block of k rounds (2k when the number of arms k is
odd) every arm takes every position equally often and follows every other
arm equally often.  The seed relabels the arms and orders the rounds of each
block, so the schedule is reproducible but not the same for every profile,
and rounds past the planned ones are further rounds of the same sequence: a
plan extended look by look is the plan that would have been drawn whole.
"""

from __future__ import annotations

import random


def williams(k: int) -> list[list[int]]:
    """The rows of a Williams design for k treatments: a Latin square whose
    rows put every treatment directly after every other exactly once
    (k even), or that square and its mirror image, where every ordered pair
    occurs twice (k odd).  Row i is the first row, 0, 1, k-1, 2, k-2, ...,
    plus i modulo k (Jones & Kenward, *Design and Analysis of Cross-Over
    Trials*, 3rd ed., 2014, section 4.2)."""
    first = [0] + [(j + 1) // 2 if j % 2 else k - j // 2 for j in range(1, k)]
    square = [[(x + i) % k for x in first] for i in range(k)]
    return square + [row[::-1] for row in square] if k % 2 else square


def block(k: int, rng: random.Random) -> list[list[int]]:
    """One block of rounds: the Williams design with the arms relabelled and
    its rows in an order drawn from `rng`.  For odd k the square comes
    first and its mirror second, so the first k rounds already balance the
    positions and all 2k balance the arm run before."""
    labels = list(range(k))
    rng.shuffle(labels)
    rows = williams(k)
    square, mirror = rows[:k], rows[k:]
    rng.shuffle(square)
    rng.shuffle(mirror)
    return [[labels[x] for x in row] for row in square + mirror]


def schedule(arm_names: list[str], repetitions: int, seed: int,
             start: int = 0) -> list[tuple[int, str]]:
    """Rounds `start`..`repetitions`-1 of the seed's sequence of balanced
    blocks, as (round, arm) in run order.  The sequence never depends on
    `repetitions`, so the rounds an adaptive run adds are the ones the whole
    plan would have had."""
    rng = random.Random(seed)
    rounds: list[list[int]] = []
    while len(rounds) < repetitions:
        rounds += block(len(arm_names), rng)
    return [(rnd, arm_names[i]) for rnd in range(start, repetitions) for i in rounds[rnd]]


def slots(order: list[tuple[int, str]]) -> list[int]:
    """Each trial's position within its round (0: first), for an order whose
    rounds are consecutive."""
    out: list[int] = []
    for i, (rnd, _) in enumerate(order):
        out.append(out[-1] + 1 if i and order[i - 1][0] == rnd else 0)
    return out
