"""The base kernel's instructions by function in each profile's timed
windows: what the check's paths ran, for its coverage (coverage.py).

Each profile's counts come from the first of: mmlab's cache (kept per
built base and profile, so a second check against a kept base counts
nothing again), the confirmation's attribution boot of the base where the
profile changed, or one attribution boot of the base arm of the profile's
first look (instructions by function only; stored with that experiment).
Only a built kernel (one with a build key) is cached.
"""

from __future__ import annotations

import json
from pathlib import Path

from mmlab.check.coverage import Counts
from mmlab.experiment.plan import Plan
from mmlab.kernels.images import Kernel
from mmlab.machine import paths
from mmlab.names import safe_name
from mmlab.run import driver
from mmlab.run.events import OnEvent
from mmlab.store import Store
from mmlab.track import cells
from mmlab.track.session import only_functions
from mmlab.track.suite import Tracked


def cache_file(base: Kernel, t: Tracked) -> Path | None:
    """Where a built base's counts of profile `t` are kept, or None."""
    key = base.details.get("build_key")
    if not key:
        return None
    return paths.cache_root() / "coverage" / safe_name(str(key)[:16]) / \
        f"{cells.profile_digest(t)}.json"


def base_counts(store: Store, here: driver.Here, on_event: OnEvent, base: Kernel,
                t: Tracked, experiments: list[int]) -> Counts | None:
    """Profile `t`'s base counts: kept, stored with one of `experiments`
    (its confirmation first), or counted on the base arm of the last of
    them (its first look); None where the base could not be counted."""
    kept = cache_file(base, t)
    if kept and kept.is_file():
        data = json.loads(kept.read_text())
        return data["windows"], data["units"]
    found = next((f for e in experiments if (f := _stored(store, e, base.name))), None)
    if found is None and experiments:
        exp_id = experiments[-1]
        here.attribute(store, exp_id, base_only(store.plan(exp_id), base.name), on_event)
        found = _stored(store, exp_id, base.name)
    if found is None:
        return None
    counts = found["windows"], found["units"]
    if kept:
        kept.parent.mkdir(parents=True, exist_ok=True)
        tmp = kept.with_suffix(".tmp")
        tmp.write_text(json.dumps({"kernel": base.name, "profile": t.name,
                                   "windows": counts[0], "units": counts[1]}))
        tmp.rename(kept)
    return counts


def _stored(store: Store, exp_id: int, kernel: str) -> dict | None:
    """The functions counted on `kernel`'s arm of an experiment, if any."""
    arms = {a.name for a in store.plan(exp_id).arms if a.kernel == kernel}
    got = store.attributions(exp_id)
    return next((got[a]["functions"] for a in arms if "functions" in got.get(a, {})), None)


def base_only(plan: Plan, kernel: str) -> Plan:
    """`plan` attributing instructions by function on `kernel`'s arm only."""
    return only_functions(plan).model_copy(
        update={"arms": [a for a in plan.arms if a.kernel == kernel][:1]})
