"""Bad input, as a new user types it: one line on stderr naming the key,
value or file, a non-zero exit, and nothing started, built, downloaded or
created first (nor changed: another program's database, a read-only
store).  And a failure is never a success: a sample whose every call
failed fails its trial in one line."""

from __future__ import annotations

import fcntl
import os
import random
import resource
import sqlite3
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from mmlab.errors import MmlabError
from mmlab.store import Store
from mmlab.workloads import insns, output

from .conftest import MMLAB, THP_PAIR, mmlab

ROOT = Path(__file__).resolve().parents[1]
PROFILE = THP_PAIR
EXEC = """
name = "bad-exec"
workload = "exec"
command = "echo 'x"
repetitions = 3
metrics = ["outside_wall_s"]
baseline = "A"
[[arms]]
name = "A"
"""


def one_line(proc: subprocess.CompletedProcess, *wanted: str) -> str:
    """The one line a failure says (beside, on a busy machine, the line that
    says a run waited for the machine lock)."""
    lines = [ln for ln in proc.stderr.strip().splitlines() if WAITED not in ln]
    assert proc.returncode not in (0, None) and len(lines) == 1, proc.stderr
    for w in wanted:
        assert w in lines[0], (w, lines[0])
    return lines[0]


WAITED = "mmlab: waiting for mmlab pid"


def profile(tmp_path: Path, text: str, name: str = "p.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("line, wanted", [
    ("max_cv = inf", ["max_cv", "finite"]),
    ("timeout_s = inf", ["timeout_s", "finite"]),
    ("tolerance = nan", ["tolerance"]),
    ("budget_s = inf", ["budget_s", "finite"]),
])
def test_values_that_cannot_be_stored_are_refused_when_read(tmp_path, line, wanted):
    path = profile(tmp_path, line + "\n" + PROFILE)
    one_line(mmlab("experiment", "plan", path), *wanted)
    one_line(mmlab("experiment", "run", path, "--results", str(tmp_path / "r")), *wanted)
    assert not (tmp_path / "r").exists()


def test_files_that_are_not_profiles_are_named(tmp_path):
    latin = tmp_path / "latin.toml"
    latin.write_bytes((PROFILE + "# caf\xe9\n").encode("latin-1"))
    one_line(mmlab("experiment", "plan", str(latin)), str(latin), "not UTF-8")
    one_line(mmlab("experiment", "run", "/bin/true"), "/bin/true", "not UTF-8")
    one_line(mmlab("experiment", "plan", str(tmp_path)), "not a regular file")
    one_line(mmlab("experiment", "plan", str(tmp_path / "missing.toml")), "no such profile")
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    one_line(mmlab("experiment", "plan", str(fifo), timeout=30), "not a regular file")


def test_exec_commands_and_sources_that_cannot_be_read(tmp_path):
    one_line(mmlab("experiment", "plan", profile(tmp_path, EXEC)), "command",
             "No closing quotation")
    src = tmp_path / "repro.c"
    src.write_bytes(b"int main(void) { return 0; } /* \xe9 */\n")
    one_line(mmlab("run", "exec", "--source", str(src), "--results", str(tmp_path / "r")),
             "not UTF-8")
    one_line(mmlab("run", "exec", "--source", str(tmp_path / "none.c")), "none.c", "no such")
    assert not (tmp_path / "r").exists()


def test_stores_are_never_created_by_mistake(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line(mmlab("compare", "1", "--results", "mysql://x"), "mysql://x", "postgresql://")
    one_line(mmlab("compare", "1", "--results", ""), "--results ''")
    one_line(mmlab("experiments", "--results", "typo"), "typo", "no mmlab store")
    one_line(mmlab("show", "1", "--results", "typo"), "no mmlab store")
    one_line(mmlab("store", "copy", str(tmp_path / "missing"), str(tmp_path / "d")),
             "missing", "no mmlab store")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    ok = mmlab("run", "pageout-refault", "--samples", "1", "--mapping-kb", "1024",
               "--rounds", "1", "--min-ms", "0", "--results", "lab")
    assert ok.returncode == 0, ok.stderr
    one_line(mmlab("store", "copy", "lab", str(tmp_path / "lab")), "same store")


def test_options_a_target_cannot_honour_are_refused(tmp_path):
    for option, value in (("--numa-nodes", "2"), ("--vcpus", "2"), ("--memory-mb", "256"),
                          ("--trace-count", "folio_alloc_swap"), ("--functions", "5")):
        one_line(mmlab("run", "pageout-refault", option, value), option, "--kernel")
    one_line(mmlab("run", "pageout-refault", "--kernel", "debian:6.12", "--numa-nodes", "99"),
             "--numa-nodes")
    cpus = profile(tmp_path, PROFILE.replace('thp = ["hugepage", "nohugepage"]',
                                             'thp = ["hugepage", "nohugepage"]\n'
                                             'cpus = ["4096-4097"]'))
    one_line(mmlab("experiment", "run", cpus, "--results", str(tmp_path / "r")),
             "CPU 4096 is not available")
    numa = profile(tmp_path, PROFILE.replace("[params]", 'kernel = "debian:6.12"\n'
                                             "memory_mb = 200\n[params]")
                   .replace('thp = ["hugepage", "nohugepage"]',
                            'thp = ["hugepage", "nohugepage"]\nnuma_nodes = [4]'), "numa.toml")
    one_line(mmlab("experiment", "plan", numa), "numa_nodes", "4 NUMA nodes in 200 MiB")


def test_builds_and_searches_check_their_inputs_first(tmp_path):
    path = profile(tmp_path, PROFILE.replace("[params]", 'kernel = "debian:6.12"\n[params]'))
    one_line(mmlab("ab", path, "--patch", "/nonexistent.patch"), "/nonexistent.patch",
             "no such file")
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    one_line(mmlab("narrow", path, "--source", str(repo), "--commits", "A..B"),
             "not a kernel source tree")
    assert subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True,
                          text=True).stdout.count("\n") == 1


def test_commands_that_do_not_apply_say_so(tmp_path):
    results = str(tmp_path / "r")
    ok = mmlab("run", "pageout-refault", "--samples", "1", "--mapping-kb", "1024",
               "--rounds", "1", "--min-ms", "0", "--results", results)
    assert ok.returncode == 0, ok.stderr
    one_line(mmlab("fleet", "status", "--results", results), "has no fleet")
    one_line(mmlab("fleet", "summary", "1", "--results", results), "has no fleet")
    one_line(mmlab("compare", "1", "--json", "--csv", "--results", results), "choose one")
    one_line(mmlab("experiment", "run", profile(tmp_path, PROFILE), "--machines", "",
                   "--results", results), "--machines", "no machine named")


def test_experiment_ids_a_store_cannot_hold_are_refused(tmp_path):
    Store(tmp_path / "r").close()
    huge = "99999999999999999999999"
    for command in (["compare", huge], ["show", huge], ["report", huge],
                    ["experiment", "resume", huge], ["fleet", "summary", huge]):
        one_line(mmlab(*command, "--results", str(tmp_path / "r")), "EXPERIMENT", huge)


def test_suites_recipes_and_profiles_that_are_binary_are_named(tmp_path):
    noise = tmp_path / "noise.toml"
    noise.write_bytes(random.Random(1).randbytes(10 << 20))
    results, dash = str(tmp_path / "r"), str(tmp_path / "dash")
    one_line(mmlab("track", "run", str(noise), "--results", results), str(noise), "not UTF-8")
    one_line(mmlab("track", "report", str(noise), "--results", results, "-o", dash),
             str(noise), "not UTF-8")
    one_line(mmlab("census", "--recipe", str(noise)), str(noise), "not UTF-8")
    for command in ("plan", "run"):
        one_line(mmlab("experiment", command, str(noise)), str(noise), "not UTF-8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["noise.toml"]


def test_environment_numbers_that_do_not_read_are_named(monkeypatch):
    monkeypatch.setenv("MMLAB_APT_MAX_AGE_S", "abc")
    one_line(mmlab("kernels", "available"), "MMLAB_APT_MAX_AGE_S", "'abc'")


def test_rounds_and_samples_on_the_command_line_have_bounds(tmp_path):
    one_line(mmlab("run", "pageout-refault", "--samples", "100000000", "--results",
                   str(tmp_path / "r")), "--samples", "10000")
    one_line(mmlab("experiment", "run", profile(tmp_path, PROFILE), "--max-repetitions", "5000",
                   "--results", str(tmp_path / "r")), "--max-repetitions", "100")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("line", ["repetitions = 100000", "max_repetitions = 5000",
                                  "samples_per_trial = 100000", "warmups = 5000"])
def test_rounds_and_samples_in_a_profile_have_bounds(tmp_path, line):
    key = line.split()[0]
    path = profile(tmp_path, PROFILE.replace("repetitions = 6", line)
                   if key == "repetitions" else line + "\n" + PROFILE)
    one_line(mmlab("experiment", "plan", path, timeout=60), "p.toml:", key)
    one_line(mmlab("selftest", "verdicts", "--profile", path, timeout=60), key)
    one_line(mmlab("experiment", "run", path, "--results", str(tmp_path / "r"), timeout=60), key)
    assert not (tmp_path / "r").exists()


def test_another_programs_database_is_refused_untouched(tmp_path):
    (tmp_path / "r").mkdir()
    db = tmp_path / "r" / "mmlab.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    before = db.read_bytes()
    one_line(mmlab("experiments", "--results", str(tmp_path / "r")), str(db),
             "not an mmlab store")
    one_line(mmlab("experiment", "run", profile(tmp_path, PROFILE), "--results",
                   str(tmp_path / "r")), "not an mmlab store")
    assert db.read_bytes() == before and os.listdir(tmp_path / "r") == ["mmlab.sqlite"]


@contextmanager
def read_only(path: Path):
    """`path` unwritable while the block runs, also for root (immutable)."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(path)], check=True)
    else:
        path.chmod(0o555)
    try:
        yield
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(0o755)


def test_a_store_that_cannot_be_written_says_so(tmp_path):
    """A run into a read-only directory is refused; reading a store there is
    not (test_store_safety reads one)."""
    (tmp_path / "empty").mkdir()
    with read_only(tmp_path / "empty"):
        one_line(mmlab("run", "pageout-refault", "--results", str(tmp_path / "empty")),
                 str(tmp_path / "empty"), "read-only directory")
    assert os.listdir(tmp_path / "empty") == []


SUITE = """
name = "two"
reference = "debian:6.12"
kernels = ["debian:6.12", "debian:7.3"]
metrics = ["advise_ns_per_page"]
[[profile]]
path = "p.toml"
"""


def test_a_tracker_report_of_nothing_measured_is_refused(tmp_path):
    profile(tmp_path, PROFILE.replace("[matrix]", '[matrix]\nkernel = ["debian:6.12"]'))
    suite = profile(tmp_path, SUITE, "suite.toml")
    Store(tmp_path / "r").close()
    one_line(mmlab("track", "report", suite, "--results", str(tmp_path / "r"), "-o",
                   str(tmp_path / "dash")), "nothing measured for suite two", "track run")
    assert not (tmp_path / "dash").exists()


def test_a_range_from_a_series_the_catalog_lacks_names_the_catalog(tmp_path):
    profile(tmp_path, PROFILE)
    suite = profile(tmp_path, SUITE.replace('["debian:6.12", "debian:7.3"]', '"debian:9.0.."'),
                    "suite.toml")
    one_line(mmlab("track", "run", suite, "--results", str(tmp_path / "r")),
             "9.0 is not a release series the Debian catalog has", "6.12")
    ranged = profile(tmp_path, PROFILE.replace("[matrix]", '[matrix]\nkernel = ["debian:9.0.."]'),
                     "ranged.toml")
    one_line(mmlab("experiment", "plan", ranged), "matrix.kernel", "9.0 is not a release series")
    assert not (tmp_path / "r").exists()


def test_a_time_cannot_be_negative_but_a_change_can():
    one_line(mmlab("run", "exec", "--samples", "1", "--metrics-from", "key=value", "--metric",
                   "x_ns:lower", "--", "echo", "x_ns=-5"), "x_ns", "'-5' is negative")
    assert output.figures("key=value", "d_kb=-5", ("d_kb",)) == {"d_kb": -5.0}
    with pytest.raises(MmlabError, match="d_kb: '-5' is negative"):
        output.figures("key=value", "d_kb=-5", ("d_kb",), ("d_kb",))


def test_a_census_recipe_naming_a_missing_program_is_refused_before_the_lock(tmp_path,
                                                                             monkeypatch):
    recipe = profile(tmp_path, 'description = "x"\ncommand = ["no-such-program", "1"]\n',
                     "recipe.toml")
    monkeypatch.setenv("MMLAB_LOCK", str(tmp_path / "lock"))
    with open(tmp_path / "lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        one_line(mmlab("census", "--recipe", recipe, timeout=30), recipe, "no-such-program")


def test_an_unknown_debian_kernel_is_refused_before_any_store(tmp_path):
    results = str(tmp_path / "r")
    one_line(mmlab("run", "pageout-refault", "--kernel", "debian:9.99", "--results", results),
             "kernel", "debian:9.99", "the Debian catalog has no 9.99")
    guest = profile(tmp_path, PROFILE.replace("[params]", 'kernel = "debian:9.99"\n[params]'))
    one_line(mmlab("experiment", "run", guest, "--results", results), "p.toml:", "9.99")
    assert not (tmp_path / "r").exists()


def test_a_sample_whose_every_call_failed_fails_its_trial(tmp_path):
    """A mapping larger than the address space allows: every mmap fails."""
    def small_address_space() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    proc = subprocess.run([*MMLAB, "run", "mremap-churn", "--bytes", "4G", "--workers", "1",
                           "--seconds", "0.2", "--samples", "1", "--results",
                           str(tmp_path / "r")], capture_output=True, text=True,
                          preexec_fn=small_address_space)
    one_line(proc, "the trial failed", "mmap ENOMEM x ")


GUEST = PROFILE.replace("[params]", 'kernel = "debian:6.12"\n[params]')


@pytest.mark.parametrize("cmdline, shown", [
    (r"quiet\n$(reboot)", r"'\n' is not allowed"),
    ("quiet $(reboot)", "'$' is not allowed"),
    ("quiet `reboot`", "'`' is not allowed"),
    ("a=1;reboot", "';' is not allowed"),
    (r"dyndbg=\"file mm +p\"", "'\"' is not allowed"),
    (r"quiet\u202e", r"'\u202e' is not allowed"),
])
def test_a_kernel_command_line_is_one_line_no_shell_reads_more_into(tmp_path, cmdline, shown):
    """`cmdline` goes to QEMU's -append and, on a bare-metal machine, as one
    line into its agent's shell script (kexec --append): a newline or a
    character a shell acts on is refused, naming the key, the value escaped."""
    path = profile(tmp_path, f'cmdline = "{cmdline}"\n' + GUEST)
    for command in (("plan", path), ("run", path, "--results", str(tmp_path / "r"))):
        line = one_line(mmlab("experiment", *command), "p.toml:1: cmdline: ", shown)
        assert line.isprintable(), line
    assert not (tmp_path / "r").exists()
    fine = profile(tmp_path, 'cmdline = "console=ttyS0,115200 isolcpus=1-3 crashkernel=256M@16M '
                             'damon_stat.enabled=N"\n' + PROFILE, "fine.toml")
    assert mmlab("experiment", "plan", fine).returncode == 0


@pytest.mark.parametrize("old, new, key, shown", [
    ('name = "thp-pair"', r'name = "thp-pair\u202e"', "name", r"'thp-pair\u202e'"),
    ('thp = ["hugepage", "nohugepage"]', r'thp = ["hugepage", "nohugepage"]' '\n'
     r'"ax\u001b[31m" = [1]', r"matrix.ax\x1b[31m", r"'ax\x1b[31m'"),
    ('thp = ["hugepage", "nohugepage"]', r'thp = ["hugepage\u0007", "nohugepage"]',
     "matrix.thp", r"'hugepage\x07'"),
    ('metrics = ["advise_ns_per_page"]', r'metrics = ["advise_ns_per_page\u0000"]', "metrics",
     r"'advise_ns_per_page\x00'"),
])
def test_names_with_control_characters_are_refused_escaped(tmp_path, old, new, key, shown):
    """A name a terminal would not show as itself (RLO reverses what follows,
    ESC restyles, BEL rings, NUL) becomes arm names, table rows and file
    names: refused when read, in one line naming the key, the value escaped."""
    path = profile(tmp_path, PROFILE.replace(old, new))
    line = one_line(mmlab("experiment", "run", path, "--results", str(tmp_path / "r")),
                    "p.toml:", f": {key}: {shown} holds U+", "control or format character")
    assert line.isprintable(), line
    assert not (tmp_path / "r").exists()


def test_arm_and_metric_names_with_control_characters_are_refused_escaped(tmp_path):
    """An arm's name in a profile, a metric's name on the command line."""
    arms = profile(tmp_path, EXEC.replace("command = \"echo 'x\"", 'command = "true"')
                   .replace('name = "A"', r'name = "A\u202e"'), "arms.toml")
    one_line(mmlab("experiment", "plan", arms), "arms.toml:", r"arms.name: 'A\u202e'")
    one_line(mmlab("run", "exec", "--metric", "x\x07:lower", "--metrics-from", "key=value",
                   "--results", str(tmp_path / "r"), "--", "echo", "x=1"),
             r"exec_metrics.x\x07: 'x\x07' holds U+0007")
    one_line(mmlab("run", "exec", "--results", str(tmp_path / "r"), "--", "echo",
                   "x\nhost_changes = true #"), r"command: 'x\nhost_changes = true #' holds")
    one_line(mmlab("run", "pageout-refault", "--thp", "a\x07", "--results", str(tmp_path / "r")),
             r"params.thp: 'a\x07' holds U+0007")
    assert not (tmp_path / "r").exists()


def test_a_guest_larger_than_this_machine_is_refused(tmp_path):
    """Every trial of a guest given more memory than the host has fails in QEMU."""
    huge = profile(tmp_path, "memory_mb = 99999999999\n" + GUEST)
    for command in (("plan", huge), ("run", huge, "--results", str(tmp_path / "r"))):
        one_line(mmlab("experiment", *command),
                 "p.toml:1: memory_mb: 99999999999 MiB is more than this machine's", "MemTotal")
    axis = profile(tmp_path, GUEST.replace('thp = ["hugepage", "nohugepage"]',
                                           'thp = ["hugepage", "nohugepage"]\n'
                                           'memory_mb = [1024, 99999999]'), "axis.toml")
    one_line(mmlab("experiment", "plan", axis), "axis.toml:", "matrix.memory_mb: 99999999 MiB")
    one_line(mmlab("run", "pageout-refault", "--kernel", "debian:6.12", "--memory-mb",
                   "99999999", "--results", str(tmp_path / "r")), "--memory-mb 99999999",
             "MemTotal")
    assert not (tmp_path / "r").exists()


def test_host_arms_get_the_cpus_this_machine_has_and_guests_their_own_vcpus(tmp_path):
    """`experiment plan` refuses a host arm pinned to more CPUs than this
    process may use; a guest's vCPUs are its own, more than the host's
    cores sharing them, so a guest arm with as many is planned."""
    more = len(os.sched_getaffinity(0)) + 1
    cpus = PROFILE.replace('thp = ["hugepage", "nohugepage"]',
                           f'thp = ["hugepage", "nohugepage"]\ncpus = [1, {more}]')
    one_line(mmlab("experiment", "plan", profile(tmp_path, cpus)), "p.toml:",
             f"matrix.cpus: cpus = {more}: only {more - 1} CPUs are available")
    guest = cpus.replace("[params]", 'kernel = "local:any"\n[params]')
    planned = mmlab("experiment", "plan", profile(tmp_path, guest, "guest.toml"))
    assert planned.returncode == 0, planned.stderr


def test_instruction_metrics_on_a_host_without_a_counter_are_refused_at_plan(tmp_path):
    """A host arm counts with the CPU's counter (perf_event_open); on a host
    without one every counting trial would fail: refused before anything is
    stored, saying why and where it can be counted.  Where the host counts,
    the same profile is planned."""
    counts = profile(tmp_path, PROFILE.replace('"advise_ns_per_page"',
                                               '"advise_ns_per_page", '
                                               '"advise_kernel_insns_per_page"'))
    commands = (("experiment", "plan", counts),
                ("experiment", "run", counts, "--results", str(tmp_path / "r")),
                ("run", "pageout-refault", "--insns", "--results", str(tmp_path / "r")))
    ok, why = insns.perf_status()
    if ok:
        assert mmlab(*commands[0]).returncode == 0
        return
    one_line(mmlab(*commands[0]), "p.toml:", "metrics: advise_kernel_insns_per_page on the host",
             why, 'a guest kernel counts it (kernel = "debian:6.12"')
    one_line(mmlab(*commands[1]), why)
    one_line(mmlab(*commands[2]), "--insns: ", why, "--kernel debian:6.12")
    assert not (tmp_path / "r").exists()


def test_no_argument_of_mmlab_run_becomes_a_key_of_its_profile():
    """`mmlab run` writes its command line as the profile's first comment: a
    newline in any argument (here --results, which the profile does not
    keep) once ended the comment and made the rest a key of the profile,
    consent to host changes included.  Planned only: nothing runs."""
    from mmlab.experiment import single
    argv = ("ksm-rmap", "--results", "r\nhost_changes = true #")
    plan = single.plan(single.Request("ksm-rmap", argv=argv))
    assert plan.profile.host_changes is False
    assert plan.text.splitlines()[0] == r"# mmlab run ksm-rmap --results 'r\nhost_changes = true #'"


def test_counts_per_syscall_on_a_host_arm_are_refused_at_plan(tmp_path):
    """Only mmlab's QEMU plugin counts per syscall and fault: a host arm
    asking for such a metric would have it silently absent, whatever
    counter the host has."""
    stays = profile(tmp_path, PROFILE.replace('"advise_ns_per_page"',
                                              '"advise_syscall_madvise_kernel_insns_per_call"'))
    one_line(mmlab("experiment", "plan", stays), "p.toml:",
             "advise_syscall_madvise_kernel_insns_per_call on the host",
             "only mmlab's QEMU plugin counts per syscall")
