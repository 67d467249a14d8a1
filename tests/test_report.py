"""Reports and bundles, on a store filled with known samples (so verdicts and
the regzbot line are predictable), and one live bundle whose reproducer is
built with gcc alone and run."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from mmlab import experiment
from mmlab.report import bundle, data, html, text
from mmlab.samples import Sample
from mmlab.store import Store

from .conftest import mmlab, run_profile

PROFILE = """\
name = "kernels"
description = "pageout on two kernels, CPUs 1 and 2"
workload = "pageout-refault"
repetitions = 5
metrics = ["cycle_ns_per_page"]
baseline = { kernel = "debian:6.1" }
[params]
mapping-kb = 1024
[matrix]
kernel = ["debian:6.1", "debian:6.12"]
cpus = [1, 2]
"""


def fake_sample(value: float, kernel: str) -> Sample:
    return Sample(workload="pageout-refault", sample=0, mmwork_version="t", params={},
                  metrics={"cycle_ns_per_page": value}, counts={"pages": 256.0},
                  rusage=dict.fromkeys(("user_s", "sys_s", "minflt", "majflt", "nvcsw",
                                        "nivcsw"), 0.0),
                  vmstat_delta={}, state={"kernel": kernel, "accelerator": "tcg",
                                          "target": "qemu"}, errors={})


@pytest.fixture
def store_with_results(tmp_path) -> tuple[Store, int]:
    """6.12 is 30 % slower than 6.1; the last round never ran (interrupted)."""
    plan = experiment.parse(PROFILE, "kernels.toml")
    store = Store(tmp_path / "r")
    exp = store.create_experiment(plan)
    for t in store.trials(exp):
        if t.round == 4:
            continue
        base = 1000.0 + 7 * t.round
        value = base * (1.3 if "6.12" in t.arm else 1.0)
        store.start_trial(t.id)
        store.finish_trial(t.id, [fake_sample(value, t.arm)], {"kernel": "6.18", "cpus": 2,
                                                                "cpu_model": "x", "governor": "-",
                                                                "mmlab_version": "0",
                                                                "git_commit": "abc"})
    return store, exp


def test_text_report_fits_a_mailing_list_and_says_everything(store_with_results):
    d = data.gather(*store_with_results)
    report = text.render(d)
    lines = report.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert "\x1b" not in report                                   # no colour
    for section in ("What was run", "Environment", "Results", "Same-state audit", "Missing",
                    "Reproduce"):
        assert section in lines
    assert "kernel: debian:6.12 vs debian:6.1" in report
    row = next(line for line in lines if line.lstrip().startswith("cpus=1 "))
    assert "+30.0%" in row and "1.300" in row and "regression" in row
    assert "tcg (emulated timings" in report
    assert "4 of 20 trials did not run (interrupted)" in report
    assert lines[-1] == "#regzbot introduced: 6.1..6.12"


def test_html_report_is_self_contained_and_renders(store_with_results, tmp_path):
    page = html.render(data.gather(*store_with_results))
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page
    assert page.count("data:image/png;base64,") >= 3               # samples, ratios, scaling
    out = tmp_path / "report.html"
    out.write_text(page)
    chromium = shutil.which("chromium")
    if not chromium:
        pytest.skip("chromium is not installed (make setup installs it)")
    shot = Path(__file__).resolve().parents[1] / "build" / "screenshots" / "report.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-quic", "--no-first-run", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1300,1800",
                           f"--screenshot={shot}", out.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert shot.stat().st_size > 20_000                          # a page was drawn


def test_bundle_has_every_file_and_a_manifest_that_checks(store_with_results, tmp_path):
    out = bundle.write(data.gather(*store_with_results), tmp_path / "b", tar=True)
    root = tmp_path / "b"
    assert out == tmp_path / "b.tar.gz" and out.stat().st_size > 0
    for name in ("README.md", "profile.toml", "env.json", "execution_order.json", "raw.csv",
                 "raw.json", "summary.csv", "summary.json", "MANIFEST.sha256"):
        assert (root / name).is_file(), name
    assert list((root / "plots").glob("*.png"))
    order = json.loads((root / "execution_order.json").read_text())
    assert len(order) == 20 and {o["status"] for o in order} == {"done", "planned"}
    for line in (root / "MANIFEST.sha256").read_text().splitlines():
        digest, name = line.split("  ", 1)
        assert hashlib.sha256((root / name).read_bytes()).hexdigest() == digest
    assert len(list(root.glob("reproducer-*.c"))) == 4


def test_the_reproducer_builds_with_gcc_alone_and_prints_the_same_metrics(tmp_path):
    run, results = run_profile(tmp_path, PROFILE.replace(
        'kernel = ["debian:6.1", "debian:6.12"]\ncpus = [1, 2]', 'thp = ["hugepage", "nohugepage"]')
        .replace('baseline = { kernel = "debian:6.1" }', 'baseline = { thp = "nohugepage" }')
        .replace("repetitions = 5", "repetitions = 3"))
    assert run.returncode == 0, run.stderr
    made = mmlab("bundle", "1", str(tmp_path / "b"), "--results", str(results))
    assert made.returncode == 0, made.stderr
    src = tmp_path / "b" / "reproducer-thp_hugepage.c"
    subprocess.run(["gcc", "-O2", "-o", str(tmp_path / "repro"), str(src)], check=True)
    proc = subprocess.run([str(tmp_path / "repro"), "--samples", "2", "--min-ms", "0"],
                          capture_output=True, text=True, check=True)
    samples = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(samples) == 2
    assert samples[0]["params"]["thp"] == "hugepage" and samples[0]["params"]["mapping-kb"] == 1024
    assert set(samples[0]["metrics"]) == {"prefault_ns_per_page", "advise_ns_per_page",
                                          "post_touch_ns_per_page", "cycle_ns_per_page"}
    report = mmlab("report", "1", "--results", str(results))
    assert "thp: hugepage vs nohugepage" in report.stdout


def test_a_report_of_an_ab_run_that_never_started_names_the_patch(tmp_path):
    plan = experiment.parse(PROFILE, "kernels.toml")
    derived = experiment.with_kernels(plan, ["build:a", "build:b"],
                                      "A/B of fix.patch sha256 0123456789abcdef")
    store = Store(tmp_path / "r")
    exp = store.create_experiment(derived)
    report = text.render(data.gather(store, exp))
    assert "this run: A/B of fix.patch sha256 0123456789abcdef" in report
    assert "20 of 20 trials did not run" in report
    assert "has 0 samples; verdicts need 3" in report
    assert all(len(line) <= 80 for line in report.splitlines())
