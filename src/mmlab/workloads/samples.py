"""The sample contract: one JSON object per line from mmwork, checked on arrival.

A sample that does not follow the contract is a bug in a workload, so it is
rejected loudly here rather than stored and discovered later by the stats.
"""

from __future__ import annotations

import json
import re

from pydantic import BaseModel, ValidationError, field_validator

from mmlab.errors import MmlabError

# A metric name carries its unit as a token: advise_ns_per_page, ops_per_s_cpu, sys_s,
# advise_kernel_insns_per_page, command_syscall_mprotect_calls; an event
# (workloads.EVENTS) is its own unit: command_kernel_ipis_per_run.
UNIT_TOKEN = re.compile(r"(^|_)(ns|us|ms|s|per_s|pages|bytes|kb|insns|calls|"
                        r"loads|stores|invlpgs|invpcids|cr3_writes|ipis)(_|$)")


class Sample(BaseModel):
    workload: str
    sample: int
    mmwork_version: str
    params: dict[str, str | float | bool]
    metrics: dict[str, float | None]
    counts: dict[str, float]
    rusage: dict[str, float]
    vmstat_delta: dict[str, float]
    state: dict[str, str | float]
    errors: dict[str, float]
    output: str | None = None   # exec: what the command printed, its metrics' source

    @field_validator("metrics")
    @classmethod
    def metric_names_carry_units(cls, metrics: dict[str, float | None]):
        for name in metrics:
            if not UNIT_TOKEN.search(name):
                raise ValueError(f"metric '{name}' does not name its unit")
        return metrics

    @field_validator("rusage")
    @classmethod
    def rusage_complete(cls, rusage: dict[str, float]):
        missing = {"user_s", "sys_s", "minflt", "majflt", "nvcsw", "nivcsw"} - rusage.keys()
        if missing:
            raise ValueError(f"rusage lacks {sorted(missing)}")
        return rusage


def parse_line(line: str) -> Sample:
    """One line of mmwork stdout as a Sample, or an MmlabError saying why not."""
    try:
        return Sample.model_validate(json.loads(line))
    except json.JSONDecodeError as exc:
        raise MmlabError(f"mmwork printed a line that is not JSON: {line[:80]!r}") from exc
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise MmlabError(f"mmwork printed a sample that breaks the contract at "
                         f"'{where}': {err['msg']}") from exc


def work_units(sample: Sample) -> tuple[float, str]:
    """What one sample did, to put CPU time per unit of work: pages or ops."""
    for key in ("pages", "ops", "data_pages"):
        if sample.counts.get(key):
            return float(sample.counts[key]), key
    return 1.0, "sample"
