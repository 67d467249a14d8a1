"""Any command as a workload: the three output formats and what
malformed output does, `mmwork exec` on the host (rusage, {out}, smaps at
exit, timeouts), a C file compiled and cached by hash, exec profiles end to
end with a failed arm that loses nothing else, and a guest that runs
Debian's dynamically linked stress-ng from the initramfs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from mmlab.errors import MmlabError
from mmlab.experiment.plan import load, parse
from mmlab.machine.knobs import HostSettings
from mmlab.store import Store
from mmlab.targets import boot, qemu
from mmlab.workloads import csource, execwork, mmwork, output
from mmlab.workloads.build import REPO_ROOT

from .conftest import mmlab, run_profile

# What stress-ng 0.15.06 wrote with -Y for `--mremap 2 --timeout 2`: the
# parser's input shape (system-info, a metrics list, the YAML end marker).
STRESS_NG_YAML = """\
---
system-info:
      stress-ng-version: 0.15.06
      date-yyyy-mm-dd: 2026:11:23
      time-hh-mm-ss: 18:17:23
      cpus: 2

metrics:
    - stressor: mremap
      bogo-ops: 352701
      bogo-ops-per-second-usr-sys-time: 97179.729363
      bogo-ops-per-second-real-time: 176247.202841
      wall-clock-time: 2.001172
      user-time: 0.174429
      system-time: 3.454939
      max-rss: 2388

...
"""


# ---------------------------------------------------------------- output formats

def test_stress_ng_yaml_gives_every_field_by_stressor_and_plainly_for_one():
    found = output.figures("stress-ng-yaml", STRESS_NG_YAML)
    assert found["bogo-ops-per-second-real-time"] == found["mremap.bogo-ops-per-second-real-time"]
    assert found["bogo-ops"] == 352701 and found["max-rss"] == 2388
    two = STRESS_NG_YAML.replace("\n...", "    - stressor: vm\n      bogo-ops: 5\n\n...")
    both = output.figures("stress-ng-yaml", two)
    assert both["vm.bogo-ops"] == 5 and "bogo-ops" not in both   # ambiguous with two


def test_key_value_tokens_anywhere_on_a_line_last_one_wins():
    found = output.figures("key=value", "starting mode=fast\nadvise_ns_per_page=380.5 "
                                          "rounds=8\nresult: cycle_ns_per_page = 1 (ignored)\n"
                                          "rounds=9 x_ns=nan\n")
    assert found == {"advise_ns_per_page": 380.5, "rounds": 9}       # x_ns=nan: no figure


def test_json_lines_flatten_nested_keys():
    found = output.figures("json", '{"metrics": {"a_ns": 5, "b": [1]}, "ok": true}\n\n'
                                     '{"metrics": {"a_ns": 7}, "n": 2, "name": "x"}\n')
    assert found == {"metrics.a_ns": 7, "n": 2}


@pytest.mark.parametrize("kind, text, message", [
    ("stress-ng-yaml", "metrics: [\n", "stress-ng YAML does not parse"),
    ("stress-ng-yaml", "system-info:\n  cpus: 2\n", "has no 'metrics' list"),
    ("stress-ng-yaml", "metrics:\n  - bogo-ops: 5\n", "without 'stressor'"),
    ("stress-ng-yaml", "metrics:\n  - stressor: vm\n    b_ns: n/a\n",
     "stress-ng YAML vm.b_ns: 'n/a' is not a number"),
    ("key=value", "a_ns=12\nb_ns=fast\n", "key=value line 2: b_ns: 'fast' is not a number"),
    ("key=value", "b_ns=nan\n", "key=value line 1: b_ns: 'nan' is not a finite number"),
    ("key=value", "b_ns=inf\n", "b_ns: 'inf' is not a finite number"),
    ("key=value", "b_ns=1e400\n", "b_ns: '1e400' is not a finite number"),
    ("json", '{"b_ns": -1e400}\n', "b_ns: -inf is not a finite number"),
    ("json", '{"a": 1}\nnot json\n', "json line 2 is not JSON"),
    ("json", "[1, 2]\n", "json line 1 is not a JSON object"),
    ("json", '{"m": {"b_ns": "?"}}\n', "json line 1: m.b_ns: '?' is not a number"),
    ("key=value", "  \n", "printed no key=value output"),
])
def test_malformed_output_is_one_line_saying_why(kind, text, message):
    with pytest.raises(MmlabError) as err:
        output.figures(kind, text, wanted=("b_ns", "m.b_ns", "vm.b_ns"))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_placeholders_fill_drop_and_refuse():
    wl = execwork.build(["prog", "--n", "{n}", "--size={kb}k", "{numa?--numa}", "-Y", "{out}"])
    assert wl.argv({"n": 2, "kb": 4, "numa": True}) == ["prog", "--n", "2", "--size=4k", "--numa",
                                                        "-Y", "{out}"]
    assert wl.argv({"n": 2, "kb": 4, "numa": False}) == ["prog", "--n", "2", "--size=4k", "-Y",
                                                         "{out}"]
    assert wl.argv({"n": 2, "kb": 4}) == ["prog", "--n", "2", "--size=4k", "-Y", "{out}"]
    with pytest.raises(MmlabError, match=r"no value for \{kb\}"):
        wl.argv({"n": 2})
    with pytest.raises(MmlabError, match="takes true or false"):
        wl.argv({"n": 2, "kb": 4, "numa": "yes"})


# ---------------------------------------------------------------- on the host

def run_one(wl: execwork.ExecWorkload, params: dict | None = None):
    (sample,) = mmwork.sample(wl, params or {}, samples=1)
    return sample


def test_exec_measures_from_outside_and_reads_out_files_and_smaps_at_exit():
    """{out} is a fresh file the command writes; rusage covers its children;
    smaps is read at its exit stop, so a mapping it still holds is seen."""
    script = ('python3 -c "import mmap; m = mmap.mmap(-1, 8 << 20); m.write(b\'x\' * (8 << 20)); '
              'print(\'{\\"touched_kb\\": 8192}\')" > {out}; sh -c \'echo pid_ns=$$\'')
    wl = execwork.build(["sh", "-c", script], metrics_from="json",
                        declared={"touched_kb": "higher"}, smaps=True)
    s = run_one(wl)
    assert s.metrics["touched_kb"] == 8192 and "pid_ns" not in s.output
    assert s.counts["command_wall_s"] > 0 and s.metrics["outside_wall_s"] == \
        s.counts["command_wall_s"]
    assert s.metrics["outside_cpu_s"] == pytest.approx(s.rusage["user_s"] + s.rusage["sys_s"])
    assert s.metrics["outside_max_rss_kb"] >= 8192          # the python child's peak
    assert s.state["exit_vmas"] > 0 and s.state["exit_rss_kb"] > 0   # sh, at its exit stop
    assert "pgfault" in s.vmstat_delta and "thp_enabled" in s.state


def test_exec_runs_stress_ng_and_reads_its_yaml(stress_ng):
    wl = execwork.build("stress-ng --mremap 1 --mremap-bytes 4K --timeout 1 --metrics-brief "
                        "-Y {out}", metrics_from="stress-ng-yaml")
    s = run_one(wl)
    m = s.metrics
    assert m["ops_per_s_real"] > 0 and s.counts["ops"] > 0
    # stress-ng's own usr+sys and the rusage of its process tree see the same run.
    assert m["outside_cpu_s"] == pytest.approx(m["usr_s"] + m["sys_s"], rel=0.25, abs=0.05)
    assert m["ops_per_s_cpu"] == pytest.approx(s.counts["ops"] / (m["usr_s"] + m["sys_s"]),
                                               rel=0.02)


@pytest.mark.parametrize("command, message", [
    (["sh", "-c", "echo oops >&2; exit 3"],
     "'sh' exited with status 3: stderr: oops; stdout: (nothing)"),
    # a program that says why on stdout (its own check failed), in a few
    # lines of each output, the last ones, with a terminal's escape shown as ?
    (["sh", "-c", "echo start; echo moved=0; printf 'check \\033[1mfailed\\n'; exit 1"],
     "'sh' exited with status 1: stderr: (nothing); stdout: start | moved=0 | check ?[1mfailed"),
    (["sh", "-c", "for i in 1 2 3 4; do echo out$i; echo err$i >&2; done; exit 1"],
     "stderr: err2 | err3 | err4; stdout: out2 | out3 | out4"),
    (["sleep", "5"], "'sleep' did not finish within 0.3 s"),
    (["sh", "-c", "kill -9 $$"], "'sh' was killed by signal 9"),
])
def test_a_failing_command_fails_its_sample_in_one_line(command, message):
    wl = execwork.build(command, timeout_s=0.3)
    with pytest.raises(MmlabError) as err:
        run_one(wl)
    assert message in str(err.value) and "\n" not in str(err.value)


EXEC_PROFILE = """\
name = "exec-arms"
workload = "exec"
command = ["sh", "-c", "echo x_ns={x} other=text"]
metrics_from = "key=value"
metrics = ["x_ns", "outside_wall_s"]
repetitions = 3
baseline = "good"
[exec_metrics]
x_ns = "lower"
[[arms]]
name = "good"
set = {x = 100}
[[arms]]
name = "also-good"
set = {x = 200}
[[arms]]
name = "bad"
set = {x = "fast"}
"""


def test_a_profile_whose_arm_prints_garbage_loses_only_that_arms_trials(tmp_path):
    proc, results = run_profile(tmp_path, EXEC_PROFILE)
    assert proc.returncode == 1 and "3 trial(s) failed" in proc.stderr, proc.stderr
    trials = Store(results).trials(1)
    assert {(t.arm, t.status) for t in trials} == {("good", "done"), ("also-good", "done"),
                                                  ("bad", "failed")}
    errors = {t.error for t in trials if t.arm == "bad"}
    assert errors == {"exec sample 0: key=value line 1: x_ns: 'fast' is not a number"}
    verdicts = json.loads(mmlab("compare", "1", "--results", str(results), "--json").stdout)
    pair = next(c for c in verdicts if c["arm"] == "also-good" and c["metric"] == "x_ns")
    assert pair["median"] == 200 and pair["median_baseline"] == 100
    report = mmlab("report", "1", "--results", str(results)).stdout
    assert "x_ns [as printed]" in report and "outside_wall_s [whole sample]" in report
    assert "commands.txt" in report


@pytest.mark.parametrize("edit, message", [
    (("metrics_from = \"key=value\"", "metrics_from = \"yaml\""), r"p\.toml:4: metrics_from"),
    (("x_ns = \"lower\"", "x = \"lower\""), r"exec_metrics\.x: a metric's name carries its unit"),
    (("x_ns = \"lower\"", "x_ns = \"up\""), r"exec_metrics\.x_ns"),
    (("set = {x = 100}", "set = {x = 100, y = 1}"), "parameter 'y' is not used by the command"),
    (('"sh", "-c"', '"no-such-program-here", "-c"'), "no-such-program-here: not found"),
    (('metrics = ["x_ns", "outside_wall_s"]', 'metrics = ["y_ns"]'), "unknown metric 'y_ns'"),
])
def test_exec_profile_errors_name_the_key(tmp_path, edit, message):
    path = tmp_path / "p.toml"
    path.write_text(EXEC_PROFILE.replace(*edit))
    with pytest.raises(MmlabError, match=message):
        load(path)


def test_exec_keys_belong_to_exec_profiles():
    text = EXEC_PROFILE.replace('workload = "exec"', 'workload = "pageout-refault"')
    with pytest.raises(MmlabError, match=r'<profile>:3: command: only for workload = "exec"'):
        parse(text)


# ---------------------------------------------------------------- C sources

TINY_C = r"""
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) { printf("n_pages=%d\n", argc > 1 ? atoi(argv[1]) : 1); return 0; }
"""


def test_a_source_is_compiled_statically_once_per_hash(tmp_path):
    first = csource.binary(TINY_C, "tiny.c", cache=tmp_path)
    built = first.stat().st_mtime_ns
    assert csource.binary(TINY_C, "tiny.c", cache=tmp_path) == first
    assert first.stat().st_mtime_ns == built                      # cached, not rebuilt
    assert not execwork.shared_libraries(first)                   # static: packs alone
    changed = csource.binary(TINY_C.replace("n_pages", "m_pages"), "tiny.c", cache=tmp_path)
    assert changed != first and changed.parent.name != first.parent.name
    with pytest.raises(MmlabError, match=r"broken\.c: does not compile .*broken\.c:1"):
        csource.binary("int main(void) { return x; }\n", "broken.c", cache=tmp_path)


SOURCE_PROFILE = """\
name = "repro-sizes"
workload = "exec"
source = "pageout_repro.c"
command = ["{source}", "--mapping-kb", "{kb}", "--rounds", "2", "--min-ms", "0", "--warmup-ms", "0"]
metrics_from = "key=value"
metrics = ["advise_ns_per_page", "cycle_ns_per_page"]
repetitions = 3
baseline = { kb = 1024 }
[exec_metrics]
advise_ns_per_page = "lower"
cycle_ns_per_page = "lower"
[matrix]
kb = [1024, 2048]
"""


def test_a_c_reproducer_runs_gets_verdicts_and_travels_in_the_bundle(tmp_path):
    shutil.copy(REPO_ROOT / "experiments/repro/pageout_repro.c", tmp_path)
    proc, results = run_profile(tmp_path, SOURCE_PROFILE)
    assert proc.returncode == 0, proc.stderr
    verdicts = json.loads(mmlab("compare", "1", "--results", str(results), "--json").stdout)
    assert {c["metric"] for c in verdicts} == {"advise_ns_per_page", "cycle_ns_per_page"}
    assert all(c["n"] == 3 and c["median"] > 0 and c["verdict"] for c in verdicts)
    bundle = tmp_path / "b"
    assert mmlab("bundle", "1", str(bundle), "--results", str(results)).returncode == 0
    assert (bundle / "pageout_repro.c").read_text() == (tmp_path / "pageout_repro.c").read_text()
    commands = (bundle / "commands.txt").read_text()
    assert "gcc -O2 -static" in commands and "kb=2048: ./pageout_repro --mapping-kb 2048" in commands
    assert not list(bundle.glob("reproducer-*.c"))


def test_run_source_on_the_command_line():
    proc = mmlab("run", "exec", "--source", str(REPO_ROOT / "experiments/repro/pageout_repro.c"), "--samples",
                 "2", "--metrics-from", "key=value", "--metric", "advise_ns_per_page:lower",
                 "--json", "--", "--mapping-kb", "1024", "--rounds", "2", "--min-ms", "0")
    assert proc.returncode == 0, proc.stderr
    samples = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(samples) == 2 and all(s["metrics"]["advise_ns_per_page"] > 0 for s in samples)
    assert "rounds=2 pages=512" in samples[0]["output"]


def test_a_metric_printed_as_nan_fails_its_trial_in_one_line():
    """nan, inf or 1e400 is no figure: the trial fails, naming the value,
    rather than be stored as missing and judged on nothing."""
    for value in ("nan", "inf", "1e400"):
        proc = mmlab("run", "exec", "--samples", "1", "--metrics-from", "key=value",
                     "--metric", "x_ns:lower", "--", "sh", "-c", f"echo x_ns={value}")
        assert proc.returncode == 2, proc.stderr
        line = proc.stderr.strip().splitlines()[-1]
        assert f"x_ns: '{value}' is not a finite number" in line, proc.stderr


# ---------------------------------------------------------------- counting instructions

MPROTECT = REPO_ROOT / "experiments/repro/mprotect_repro.c"


def counted_workload(**keys) -> execwork.ExecWorkload:
    return execwork.build(["{source}", "256"], source=str(MPROTECT), metrics_from="key=value",
                          per="pages", windows={"protect": execwork.ExecWindow(id=1, per="pages")},
                          **keys)


def test_an_exec_workload_counts_its_command_and_the_windows_it_marks():
    """The whole command is window 0, the program's MMLAB_BEGIN(id) windows
    keep their ids, and each window's metrics are per the unit its output
    key names (per run when none)."""
    wl = counted_workload()
    assert [(w.name, w.marker, w.unit) for w in wl.windows] == [
        ("command", 0, "pages"), ("protect", 1, "pages")]
    assert {"command_kernel_insns_per_pages", "protect_user_insns_per_pages"} <= \
        {m.name for m in wl.metrics if m.unit == "insns"}
    bare = execwork.build(["true"])
    assert [w.kernel_metric for w in bare.windows] == ["command_kernel_insns_per_run"]
    ng = execwork.build(["stress-ng"], metrics_from="stress-ng-yaml", per="bogo-ops")
    assert ng.windows[0].kernel_metric == "command_kernel_insns_per_bogo_ops"
    args = wl.args({"insns": True})
    assert args.index("--insns") < args.index("--")            # mmwork's flag, not the command's
    assert "--insns" not in wl.args({})


@pytest.mark.parametrize("keys, message", [
    ({"per": "pages"}, "per: units read from the output need metrics_from"),
    ({"metrics_from": "key=value", "windows": {"a": execwork.ExecWindow(id=1),
                                               "b": execwork.ExecWindow(id=1)}},
     "windows.b: id 1 names two windows"),
    ({"metrics_from": "key=value", "windows": {"command": execwork.ExecWindow(id=2)}},
     "windows.command: .*not 'command'"),
])
def test_counted_windows_that_cannot_work_are_refused_naming_the_key(keys, message):
    with pytest.raises(execwork.ProfileKeyError) as refused:
        execwork.build(["true"], **keys)
    assert re.search(message, f"{refused.value.key}: {refused.value}")


def test_a_window_id_outside_1_to_7_is_refused_in_the_profile_and_on_the_command_line(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(EXEC_PROFILE + "[windows.w]\nid = 8\n")
    with pytest.raises(MmlabError, match=r"p\.toml:\d+: windows\.w\.id"):
        load(path)
    proc = mmlab("run", "exec", "--window", "w=0", "--", "true")
    assert proc.returncode == 2 and "--window 'w=0': expected NAME=ID" in proc.stderr


def test_the_units_come_from_the_output_and_perf_counts_become_metrics():
    """A missing units key fails the sample in one line; where mmwork
    counted with perf (`insns_window<id>_*`), the metrics are the mean
    window's instructions per unit."""
    wl = counted_workload()
    raw = run_one(execwork.build(["true"])).model_copy(update={
                 "output": "pages=256\n", "counts": {
                     "insns_window0_windows": 1, "insns_window0_kernel_insns": 2560,
                     "insns_window0_user_insns": 512, "insns_window1_windows": 2,
                     "insns_window1_kernel_insns": 5120, "insns_window1_user_insns": 0}})
    s = wl.measured(raw)
    assert s.counts["command_units"] == 256 and s.counts["protect_units"] == 256
    assert s.metrics["command_kernel_insns_per_pages"] == 10
    assert s.metrics["protect_kernel_insns_per_pages"] == 10      # 5120 / 2 windows / 256
    with pytest.raises(MmlabError, match="has no 'pages' \\(the units of window command\\)"):
        wl.measured(raw.model_copy(update={"output": "other=1\n"}))


def test_mmwork_exec_reads_the_programs_window_file_and_says_why_perf_is_missing():
    """The program's windows reach mmwork through the file MMLAB_INSNS names
    (a shell plays the header's part); the command's own counters need a
    PMU, and where perf_event_open fails the sample says so."""
    wl = execwork.build(["sh", "-c", 'echo "2 3 300 600" >> "$MMLAB_INSNS"; echo "2 1 100 0" '
                         '>> "$MMLAB_INSNS"'])
    s = run_one(wl, {"insns": True})
    assert (s.counts["insns_window2_windows"], s.counts["insns_window2_kernel_insns"],
            s.counts["insns_window2_user_insns"]) == (4, 400, 600)
    if "insns_window0_windows" not in s.counts:
        assert s.state["insns_source"].startswith("none (perf_event_open")
    assert "MMLAB_INSNS" not in run_one(execwork.build(["sh", "-c", "env"])).output


def test_the_header_builds_cleanly_and_leaves_a_program_unchanged(tmp_path):
    """mmlab.h compiles without a warning, refuses window 0 (the command's)
    at compile time, and without mmlab around a marked program runs as it
    would without the header."""
    binary = csource.binary(MPROTECT.read_text(), "mprotect_repro.c", cache=tmp_path)
    out = subprocess.run([binary, "64"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("pages=64\n")
    strict = subprocess.run(["gcc", "-Wall", "-Wextra", "-Werror", "-O2", f"-I{csource.HEADER.parent}",
                             "-o", tmp_path / "strict", MPROTECT], capture_output=True, text=True)
    assert strict.returncode == 0, strict.stderr
    zero = MPROTECT.read_text().replace("MMLAB_BEGIN(1)", "MMLAB_BEGIN(0)")
    with pytest.raises(MmlabError, match="does not compile"):
        csource.binary(zero, "zero.c", cache=tmp_path)
    assert mmlab("header").stdout == csource.HEADER.read_text()


# ---------------------------------------------------------------- in a guest


def test_source_anywhere_in_the_command_travels_into_a_guest(tmp_path, k612):
    """`env K=V {source}`: env is the program, the compiled reproducer one
    of its arguments; the guest gets both."""
    (tmp_path / "tiny.c").write_text(TINY_C)
    wl = execwork.build(["env", "SIZE_MB=8", "{source}", "7"], source="tiny.c", base=tmp_path,
                        metrics_from="key=value", declared={"n_pages": "higher"})
    assert wl.binary() in wl.programs({})
    guest = boot.Guest(k612, vcpus=1, memory_mb=256, timeout_s=300)
    (s,) = qemu.sample(guest, wl, {}, 1, 0, HostSettings())
    assert s.metrics["n_pages"] == 7 and s.state["guest_kernel"] == "debian:6.12"

def test_debian_stress_ng_runs_in_a_guest_from_its_packed_libraries(stress_ng, k612):
    """Debian's stress-ng is dynamically linked: the binary, its loader and
    every library ldd names go into the initramfs at their host paths."""
    wl = execwork.build("stress-ng --mremap 1 --mremap-bytes 4K --timeout 1 --metrics-brief "
                        "-Y {out}", metrics_from="stress-ng-yaml", smaps=True)
    packed = wl.programs({})
    assert packed[0].name == "stress-ng" and any("libc.so" in p.name for p in packed)
    guest = boot.Guest(k612, vcpus=1, memory_mb=512, timeout_s=300)
    (s,) = qemu.sample(guest, wl, {}, 1, 0, HostSettings())
    assert s.state["guest_kernel"] == "debian:6.12"
    assert s.metrics["ops_per_s_real"] > 0 and s.metrics["outside_cpu_s"] > 0
    assert s.state["exit_vmas"] > 0


def test_a_c_reproducers_metrics_get_verdicts_in_a_guest(tmp_path, k612):
    shutil.copy(REPO_ROOT / "experiments/repro/pageout_repro.c", tmp_path)
    text = SOURCE_PROFILE.replace('workload = "exec"', 'workload = "exec"\nkernel = "debian:6.12"'
                                  '\nmemory_mb = 256')
    proc, results = run_profile(tmp_path, text, timeout=900)
    assert proc.returncode == 0, proc.stderr
    verdicts = json.loads(mmlab("compare", "1", "--results", str(results), "--json").stdout)
    assert all(c["n"] == 3 and c["median"] > 0 for c in verdicts), verdicts
    assert "accelerator" in mmlab("report", "1", "--results", str(results)).stdout


def test_stress_ng_run_as_it_is_gives_its_own_figures_or_one_line(stress_ng):
    """The benchmarks' peer: stress-ng's YAML read back by mmlab's names."""
    found = execwork.run_stress_ng(["stress-ng", "--mremap", "1", "--mremap-bytes", "4K",
                                    "--timeout", "1", "--metrics-brief"],
                                   ("ops_per_s_real", "ops_per_s_cpu"))
    assert found["ops_per_s_real"] > 0 and found["ops_per_s_cpu"] > 0
    with pytest.raises(MmlabError, match="stress-ng --no-such-stressor 1 failed"):
        execwork.run_stress_ng(["stress-ng", "--no-such-stressor", "1"], ("ops_per_s_real",))
