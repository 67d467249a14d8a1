"""The machines of a fleet, in the shared store: each worker's probe (the
machine class its verdicts belong to, the bare-metal machine it drives, if
any, and the kernel cache it reads), its Celery node and broker, and when
its current worker started."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from mmlab.errors import MmlabError
from mmlab.machine import paths
from mmlab.store import Store

SCHEMA = """
CREATE TABLE IF NOT EXISTS machines (
    name TEXT PRIMARY KEY,
    node TEXT NOT NULL,                 -- the worker's Celery node, name@host
    broker TEXT NOT NULL,               -- where its queue is
    probe TEXT NOT NULL,                -- probe.machine(), kernel_cache(), bare_metal() as JSON
    registered REAL NOT NULL            -- when its current worker started
);
"""


@dataclass(frozen=True)
class Registration:
    """A machine as its worker registered it: where the worker listens and
    what its probe found (not the machine itself: a bare-metal machine is
    targets.baremetal.Machine)."""
    name: str
    node: str
    broker: str
    probe: dict
    registered: float

    @property
    def bare_metal(self) -> str | None:
        """The bare-metal machine its worker drives (--bare-metal), if any."""
        found = self.probe.get("bare_metal")
        return found["machine"] if found else None

    @property
    def kernel_cache(self) -> dict:
        """The kernel cache its worker reads ({"id", "path"}); empty when its
        worker's mmlab did not yet say (unknown)."""
        return self.probe.get("kernel_cache") or {}

    def reads_cache(self, identity: str | None) -> bool:
        """Whether its worker reads the kernel cache of that identity (one
        folder, shared), so it boots the kernels built into it."""
        return identity is not None and self.kernel_cache.get("id") == identity

    def which_cache(self) -> str:
        """The kernel cache its worker reads, in words, for messages."""
        path = self.kernel_cache.get("path")
        host = self.node.partition("@")[2]
        return (f"reads the kernel cache {path} on {host}" if path else
                "has not said which kernel cache it reads (an older mmlab's worker: start "
                "it again)")

    def describe(self) -> str:
        """Its machine class: the worker's host, and the bare-metal machine
        first when the worker drives one (its trials run there)."""
        p = self.probe
        host = (f"{p['cpus']} x {p['cpu_model']}, {p['memory']}, {p['numa_nodes']} NUMA "
                f"node(s), {p['kernel']}, guests {p['accelerator'].upper()}")
        if self.bare_metal is None:
            return host
        return f"{self.bare_metal} by kexec ({p['bare_metal']['accelerator']}); worker on {host}"


def bare_metal(name: str, accelerator: str) -> dict:
    """What a worker that drives a bare-metal machine adds to its probe."""
    return {"bare_metal": {"machine": name, "accelerator": accelerator}}


def kernel_cache() -> dict:
    """What every worker adds to its probe: the identity and path of the
    kernel cache it reads, made now if the cache has none yet."""
    return {"kernel_cache": {"id": paths.kernel_cache_id(), "path": str(paths.kernel_cache())}}


def register(store: Store, name: str, node: str, broker: str, probe: dict) -> None:
    store.db.create(SCHEMA)
    with store.db.transaction():
        store.db.execute("INSERT INTO machines (name, node, broker, probe, registered) "
                         "VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                         "node=excluded.node, broker=excluded.broker, probe=excluded.probe, "
                         "registered=excluded.registered",
                         (name, node, broker, json.dumps(probe), time.time()))


def machines(store: Store) -> dict[str, Registration]:
    """Every registered machine by name."""
    store.db.create(SCHEMA)
    return {r["name"]: Registration(r["name"], r["node"], r["broker"], json.loads(r["probe"]),
                               r["registered"])
            for r in store.db.execute("SELECT * FROM machines ORDER BY name")}


def lookup(store: Store, names: list[str]) -> dict[str, Registration]:
    """The named machines, each registered by its worker, all on one broker."""
    known = machines(store)
    missing = [n for n in names if n not in known]
    if missing:
        raise MmlabError(f"machine {missing[0]}: no worker has registered in {store.where} "
                         f"(on it: mmlab worker --name {missing[0]} --results ...; "
                         f"registered: {', '.join(known) or 'none'})")
    found = {n: known[n] for n in names}
    brokers = {m.broker for m in found.values()}
    if len(brokers) > 1:
        raise MmlabError(f"machines {', '.join(names)} use different brokers; one fleet run "
                         "needs one broker")
    return found
