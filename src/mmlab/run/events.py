"""What a run tells whoever started it, as it goes: one callback of events.

Every command that runs experiments hands one `OnEvent` to the run at its
start (`driver.run_experiment`, the tracker's session) and renders what it
hears: a progress bar, messages above it.  The run never prints and never
learns where its words go, so the same run serves a terminal, `--json`
(messages on stderr) and the tests (a list).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mmlab.experiment.plan import Plan
    from mmlab.judge.verdicts import Judgement
    from mmlab.store import Store, Trial


@dataclass(frozen=True)
class Created:
    """New experiments are stored (one here, one per machine on a fleet),
    before their first trial."""
    store: Store
    ids: list[int]
    plan: Plan


@dataclass(frozen=True)
class Message:
    """A line for the person: a target fetching a kernel, a control added,
    a trial re-queued.  Plain text, never markup."""
    text: str


@dataclass(frozen=True)
class TrialStarting:
    """Trial `index` of `total` (counted over the experiment) is starting;
    `machine` names the fleet machine running it, "" here."""
    trial: Trial
    index: int
    total: int
    machine: str = ""


@dataclass(frozen=True)
class Looked:
    """A look judged the rounds so far; `judgement.next_rounds` says
    whether rounds are being added."""
    judgement: Judgement
    machine: str = ""


@dataclass(frozen=True)
class Progressed:
    """A step of a longer job (the tracker's cells): `done` of `total`."""
    what: str
    done: int
    total: int


Event = Created | Message | TrialStarting | Looked | Progressed
OnEvent = Callable[[Event], None]


def ignore(_event: Event) -> None:
    """The listener of a run nobody watches."""


def saying(on_event: OnEvent) -> Callable[[str], None]:
    """A `say(text)` for code that only speaks lines (targets, the pool)."""
    return lambda text: on_event(Message(text))
