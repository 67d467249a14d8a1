"""A lab of many machines: one profile run on a fleet, on Celery.

Every machine runs one worker (`mmlab worker --name NAME`) that consumes one
queue of its own, `mmlab.NAME`, one trial at a time; a fleet run stores one
experiment per machine, with the profile's interleaved schedule, in a shared
PostgreSQL store, and sends each planned trial to its machine's queue.  The
worker takes (claims) the trial in the store, runs it with the same targets a
local run uses (settings journaled and restored on that machine) and commits
it as it ends.  Verdicts are per machine's experiment, so they never mix
machines; `summary.py` says on which machines a change reproduced.

  engine.py       the Celery app: broker, queue names, the one task's name, pings
  registry.py     the machines table: each worker's probe and Celery node
  worker.py       `mmlab worker`: register, consume the machine's queue, run trials
  coordinator.py  plan per machine, dispatch each look's trials, notice lost workers
  summary.py      per-machine verdicts side by side; `mmlab fleet status` data
                  (report/terminal/fleet.py renders both)

The fleet's benchmark (`make bench-fleet`) and the private PostgreSQL and
Redis it and the tests start are in bench/ (fleet.py, services.py).

Nothing here is imported by a local run: celery and psycopg (the `fleet`
extra) load only when a fleet command or a postgresql:// store is used.
"""

from __future__ import annotations

import re

from mmlab.errors import MmlabError

MACHINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def machine_name(name: str) -> str:
    if not MACHINE_NAME.match(name):
        raise MmlabError(f"machine name {name!r}: letters, digits, '.', '_' and '-' only, "
                         "at most 63")
    return name


def machine_names(text: str) -> list[str]:
    """--machines a,b,c: names checked, each once."""
    names = [machine_name(n.strip()) for n in text.split(",") if n.strip()]
    if not names:
        raise MmlabError(f"--machines {text!r}: no machine named")
    if len(set(names)) != len(names):
        raise MmlabError(f"--machines {text!r}: a machine is named twice")
    return names


def queue(machine: str) -> str:
    """The one queue a machine's worker consumes."""
    return f"mmlab.{machine}"
