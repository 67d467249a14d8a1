"""An evidence bundle: everything a maintainer needs to audit a claim, with a
manifest of SHA-256 sums, and reproducers that need only gcc."""

from __future__ import annotations

import hashlib
import json
import shlex
import tarfile
from pathlib import Path

from mmlab.names import safe_name
from mmlab.report import auditnotes, flamegraph, plots, reproducer, text
from mmlab.report import csv as report_csv
from mmlab.report import json as report_json
from mmlab.report.data import ReportData
from mmlab.workloads import csource, execwork


def _raw_rows(d: ReportData) -> list[dict]:
    rows = []
    for arm, ss in d.samples.items():
        for i, s in enumerate(ss):
            rows.append({"arm": arm, "index": i, **{f"metric.{k}": v for k, v in s.metrics.items()},
                         **{f"rusage.{k}": v for k, v in s.rusage.items()}})
    return rows


def _reproducers(d: ReportData, out: Path) -> None:
    """mmwork's workloads: a single-file C reproducer per arm.  An exec
    workload: the command each arm ran and, for a C file, that file as the
    experiment stored it (with the gcc line that built it)."""
    wl = d.workload
    if not isinstance(wl, execwork.ExecWorkload):
        for arm in d.plan.arms:
            (out / f"reproducer-{safe_name(arm.name)}.c").write_text(
                reproducer.source(wl, arm.params, f"{d.plan.profile.name}, arm {arm.name}"))
        return
    program = None
    if wl.source_text is not None:
        name = safe_name(Path(wl.source_name or "repro.c").name)
        (out / name).write_text(wl.source_text)
        program = f"./{Path(name).stem}"
        build = f"gcc {' '.join(csource.CFLAGS)} -o {program} {name} {' '.join(csource.LIBS)}\n"
    lines = [f"# {d.plan.profile.name}: the command of each arm ({{out}}: a file the "
             "command writes its figures to)\n", *([build] if program else [])]
    lines += [f"{arm.name}: {shlex.join(wl.argv(arm.params, program))}\n" for arm in d.plan.arms]
    (out / "commands.txt").write_text("".join(lines))


def write(d: ReportData, out: Path, tar: bool = False) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    report = text.render(d)
    (out / "README.md").write_text(f"# mmlab evidence: {d.plan.profile.name}\n\n"
                                   f"```\n{report}```\n\nFiles: see MANIFEST.sha256.\n")
    (out / "report.txt").write_text(report)
    (out / "profile.toml").write_text(d.row["profile_text"])
    (out / "env.json").write_text(json.dumps(d.environments, indent=1))
    (out / "execution_order.json").write_text(json.dumps(
        [{"position": t.position, "round": t.round, "arm": t.arm, "status": t.status,
          "started": t.started, "ended": t.ended, "error": t.error} for t in d.trials], indent=1))
    (out / "raw.json").write_text(json.dumps(
        {arm: [s.model_dump() for s in ss] for arm, ss in d.samples.items()}, indent=1))
    report_csv.write(out / "raw.csv", _raw_rows(d))
    summary = text.summary_rows(d)
    report_csv.write(out / "summary.csv", summary)
    verdict_rows = [{**c.as_dict(), **auditnotes.fields(d.plan, d.judgement, d.samples, c)}
                    for c in d.judgement.comparisons]
    (out / "summary.json").write_text(json.dumps({"arms": summary, "comparisons": verdict_rows,
                                                  "missing": d.missing}, indent=1))
    report_csv.write(out / "verdicts.csv", [
        {**c.as_row(), **auditnotes.columns(d.plan, d.judgement, d.samples, c)}
        for c in d.judgement.comparisons])
    (out / "plots").mkdir(exist_ok=True)
    for name, png in plots.all_figures(d).items():
        (out / "plots" / f"{name}.png").write_bytes(png)
    if d.explanation:
        flamegraph.write(out / "attribution", d.explanation)
        (out / "attribution" / "attribution.json").write_text(json.dumps(
            {arm: a.model_dump(exclude_none=True) for arm, a in d.attributions.items()}))
        (out / "attribution" / "explanation.json").write_text(
            report_json.explanation(d.explanation))
    _reproducers(d, out)
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "MANIFEST.sha256")
    (out / "MANIFEST.sha256").write_text("".join(
        f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(out)}\n" for p in files))
    if tar:
        archive = out.with_suffix(".tar.gz")
        with tarfile.open(archive, "w:gz") as t:
            t.add(out, arcname=out.name)
        return archive
    return out
