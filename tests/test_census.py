"""The census counts what the kernel holds: a mapping split the way ksm-rmap
splits it (mprotect PROT_NONE on every other page) is exactly N VMAs on one
anon_vma; bad input is one line naming the PID or command, exit 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from mmlab.census import command, guest, iterator, recipe, take
from mmlab.errors import MmlabError
from mmlab.machine.knobs import HostSettings
from mmlab.targets import hostroot
from mmlab.targets.boot import Guest, run_script

from .conftest import MMLAB, is_root

ROOT = Path(__file__).resolve().parents[1]
SPLITTER = ROOT / "experiments" / "census" / "splitter.c"
RECIPES = sorted((ROOT / "experiments" / "census").glob("*.toml"))
needs_iterator = pytest.mark.skipif(not is_root() or not Path("/sys/kernel/btf/vmlinux").exists(),
                                    reason="the census needs root and the kernel's BTF")

def mmlab_census(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*MMLAB, "census", *args], capture_output=True,
                          text=True, timeout=120, check=False, **kw)


@pytest.fixture(scope="module")
def splitter(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("splitter") / "splitter"
    subprocess.run(["cc", "-O2", "-o", str(out), str(SPLITTER)], check=True)
    return out


@pytest.fixture
def held(splitter):
    """Start the splitter holding its mapping (until its stdin closes)."""
    started = []

    def start(pages: int, pattern: str) -> subprocess.Popen:
        p = subprocess.Popen([str(splitter), str(pages), pattern, "0"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        started.append(p)
        assert p.stdout.readline() == "ready\n"
        return p
    yield start
    for p in started:
        p.kill()
        p.wait()


def test_parse_keeps_one_view_of_each_mm():
    text = ("7 7 1 1000 3000 73 0 0 ffff1 ffff1 a b\n"
            "7 8 1 1000 3000 73 0 0 ffff1 ffff1 a b\n"
            "9 9 7 5000 6000 73 5 1 0 0 c\n")
    vmas = iterator.parse(text)
    assert [(v.tgid, v.ppid, v.start, v.comm, v.file) for v in vmas] == [
        (7, 1, 0x1000, "a b", False), (9, 7, 0x5000, "c", True)]
    assert command.tree(vmas, {7}) == {7, 9}


@needs_iterator
@pytest.mark.parametrize("pages", [1000, 1001])
def test_guard_pattern_is_exactly_n_vmas_on_one_anon_vma(held, pages):
    p = held(pages, "guard")
    (found,) = take.take([p.pid], top=1).processes
    group = found.groups[0]
    assert (found.largest_group, group.vmas, group.anon_vmas, group.largest_anon_vma,
            group.processes) == (pages, pages, 1, pages, 1)
    assert group.pattern.boundaries == {"protection": pages - 1}
    assert group.pattern.protections == {"rw-p": (pages + 1) // 2, "---p": pages // 2}


@needs_iterator
def test_madv_dontneed_does_not_split(held):
    p = held(1001, "dontneed")
    (found,) = take.take([p.pid], top=1).processes
    assert found.largest_group <= 2      # libc's data pair at most: the mapping is one VMA


@needs_iterator
def test_mlock_splits_and_the_pattern_names_it(held):
    p = held(101, "mlock")
    group = take.take([p.pid], top=1).processes[0].groups[0]
    assert group.vmas == 101
    assert group.pattern.boundaries == {"flags: lo": 100}


@needs_iterator
def test_a_kernel_thread_has_no_vmas():
    (kthreadd,) = take.take([2]).processes
    assert (kthreadd.comm, kthreadd.vmas, kthreadd.largest_group) == ("kthreadd", 0, 0)


@needs_iterator
def test_every_process_includes_the_split_one(held):
    p = held(501, "guard")
    found = take.take(None, top=3)
    assert found.processes[0].pid == p.pid and found.processes[0].largest_group == 501
    assert len(found.processes) > 2 and found.shown == 3


@needs_iterator
def test_the_census_of_every_process_sees_this_one_and_times_itself():
    """Every process, this test's own among them, and how long the reading
    took (its speed, under 2 s, is held by `make bench` beside cat
    /proc/*/maps, not here: a timed test fails beside a busy neighbour)."""
    found = take.take(None)
    assert found.seconds > 0 and found.vmas > 0
    assert os.getpid() in {p.pid for p in found.processes}


@needs_iterator
def test_a_command_is_sampled_and_reported_at_its_peak(splitter):
    ran = command.survey([str(splitter), "301", "guard", "1.5"], interval_s=0.2, top=1)
    assert ran.exit_code == 0 and len(ran.moments) >= 3
    assert ran.peak.processes[0].largest_group == 301
    assert max(s.largest_group for s in ran.moments) == 301


@needs_iterator
def test_a_program_no_reading_caught_is_seen_at_its_exit(splitter, monkeypatch):
    """However late the readings come on a busy machine, a short command is
    seen: here no reading while it runs sees anything (each comes, as it
    were, after the command is gone), and the census taken at its exit
    stop finds its 301 VMAs on one anon_vma all the same."""
    monkeypatch.setattr(command.Moments, "read", lambda self: None)
    monkeypatch.setattr(command, "ksm_sharing", lambda: 42)    # as if ksmd ran: read then too
    ran = command.survey([str(splitter), "301", "guard", "0.001"], interval_s=0.05, top=1)
    assert ran.exit_code == 0 and len(ran.moments) == 1
    assert ran.peak.processes[0].largest_group == 301 and ran.moments[0].ksm_pages_sharing == 42


@needs_iterator
def test_cli_json_and_table(held):
    p = held(201, "guard")
    done = mmlab_census("--pid", str(p.pid), "--json")
    assert done.returncode == 0, done.stderr
    assert '"largest_group": 201' in done.stdout
    done = mmlab_census("--pid", str(p.pid))
    assert done.returncode == 0 and f"{p.pid} splitter: 2" in done.stdout


# ---------------------------------------------------------------- bad input

def test_a_pid_that_does_not_exist_is_one_line():
    pid = 4_000_000    # above pid_max's ceiling
    with pytest.raises(MmlabError, match=f"PID {pid}: no such process"):
        take.take([pid])
    done = mmlab_census("--pid", str(pid))
    assert (done.returncode, done.stderr) == (2, f"mmlab: PID {pid}: no such process\n")


@needs_iterator
def test_a_pid_that_exits_mid_census_is_named(held, monkeypatch):
    p = held(11, "guard")
    real = iterator.read

    def read_then_exit():
        found = real()
        p.kill()
        p.wait()
        return found
    monkeypatch.setattr(iterator, "read", read_then_exit)
    with pytest.raises(MmlabError, match=f"PID {p.pid} exited during the census"):
        take.take([p.pid])


def test_a_thread_is_not_a_process():
    ready, done = threading.Event(), threading.Event()
    t = threading.Thread(target=lambda: (ready.set(), done.wait()))
    t.start()
    ready.wait()
    try:
        tid = t.native_id
        with pytest.raises(MmlabError, match=f"PID {tid} is a thread of process {os.getpid()}"):
            take.take([tid])
    finally:
        done.set()
        t.join()


@needs_iterator
@pytest.mark.parametrize("argv, message", [
    (["false"], "false: exited with status 1"),
    (["/nonexistent/cmd"], "/nonexistent/cmd: cannot run"),
    (["sh", "-c", "echo oops >&2; exit 3"], "exited with status 3: oops"),
])
def test_a_failing_command_is_one_line(argv, message):
    with pytest.raises(MmlabError, match=message):
        command.survey(argv, interval_s=0.05)
    done = mmlab_census("--", *argv)
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1


def test_a_command_that_ran_and_ended_before_the_first_look_is_not_called_unstarted(tmp_path):
    """mmcensus wrote the command's PID and both are gone by the time mmlab
    first looks (a busy machine): the command ran; its status decides."""
    held = tmp_path / "held"
    held.write_text("pid 4321\n")
    child = subprocess.Popen(["true"])
    child.wait()
    with tempfile.TemporaryFile("w+") as log:
        assert command._held_pid(held, child, ["sh"], log) == 4321


def test_no_target_or_two_is_one_line():
    done = mmlab_census()
    assert done.returncode == 2 and "give one of" in done.stderr
    done = mmlab_census("--all", "--pid", "1")
    assert done.returncode == 2 and "give one of" in done.stderr


@pytest.mark.skipif(not is_root(), reason="needs root to drop to nobody")
def test_no_permission_is_one_line():
    done = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                           "--inh-caps=-all", *MMLAB, "census", "--all"],
                          capture_output=True, text=True, timeout=120, cwd="/", check=False,
                          env={**os.environ, "MMLAB_STATE_DIR": "/tmp"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("mmlab: census: not permitted") and \
        done.stderr.count("\n") == 1, done.stderr


def test_recipes_load_and_a_bad_key_is_named(tmp_path):
    for path in RECIPES:
        assert recipe.load(path).command
    bad = tmp_path / "bad.toml"
    bad.write_text('description = "x"\ncommand = ["true"]\ninterval = 1\n')
    with pytest.raises(MmlabError, match="bad.toml: interval: Extra inputs"):
        recipe.load(bad)


SERVICE_SECONDS = "301.37"


@needs_iterator
def test_a_recipe_runs_its_steps_and_kills_its_services(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text(f"""description = "splitter with a sleeping service"
prepare = [["cc", "-O2", "-o", "{{work}}/splitter", "{SPLITTER}"]]
command = ["{{work}}/splitter", "51", "guard", "0.6"]
interval_s = 0.1
[[services]]
command = ["sleep", "{SERVICE_SECONDS}"]
ready = ["true"]
""")
    ran = recipe.survey(path, top=2)
    assert ran.peak.processes[0].largest_group == 51
    # An odd duration names this test's service alone on a shared machine.
    assert subprocess.run(["pgrep", "-f", f"^sleep {SERVICE_SECONDS}$"],
                          check=False).returncode == 1


# ---------------------------------------------------------------- in a guest

def test_a_recipe_with_services_travels_only_from_the_host_root(tmp_path):
    path = tmp_path / "served.toml"
    path.write_text('description = "x"\ncommand = ["true"]\n'
                    '[[services]]\ncommand = ["sleep", "300"]\n')
    with pytest.raises(MmlabError, match='served.toml: cannot run in a guest: its services.*'
                                         'root = "host"'):
        recipe.survey(path, kernel="debian:7.3")
    done = mmlab_census("--recipe", str(path), "--kernel", "debian:7.3")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    path.write_text(path.read_text() + '[guest]\nroot = "host"\n')
    recipe.travels(path, recipe.load(path))


def test_the_jvm_and_database_recipes_run_from_the_host_root():
    for name in ("jvm-g1", "jvm-parallel", "jvm-serial", "jvm-zgc", "jvm-shenandoah", "ksm-jvm",
                 "postgres-pgbench"):
        assert recipe.load(ROOT / "experiments" / "census" / f"{name}.toml").guest.root == "host"


def test_guest_steps_name_a_failing_step_and_poll_services(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("""description = "x"
prepare = [["cc", "-o", "{work}/p", "{here}/p.c"]]
setup = [["false"]]
command = ["{work}/p"]
[[services]]
command = ["db", "-D", "{work}/db"]
ready = ["isready"]
[guest]
root = "host"
""")
    steps = recipe.guest_steps(recipe.load(path), {"here": "/h", "work": "/w", "port": "1"})
    lines = steps.splitlines()
    assert lines[0].startswith("cc -o /w/p /h/p.c || {") and "'cc -o /w/p'" in lines[0]
    assert "db -D /w/db < /dev/null" in steps and f">> {guest.SERVICES}" in steps
    assert "until isready" in steps and lines[-1].startswith("false || {")
    failed = subprocess.run(["sh", "-c", recipe.guest_steps(
        recipe.load(path).model_copy(update={"prepare": [], "services": []}), {})],
        capture_output=True, text=True)
    assert failed.returncode == 1 and "step failed (status 1): false" in failed.stderr


def test_a_host_root_census_samples_the_services_and_names_a_failed_step():
    text = guest.script(["/p"], Path("/m"), 0.5, root=guest.HostRoot(Path("/x"), "true"))
    assert "mount -t virtiofs -o ro hostroot /host" in text
    assert text.index("/tmp/mmlab-steps.sh") < text.index("chroot /host /p > /tmp/cmd.out")
    out = "\n".join([f"{guest.MARK} also 9", f"{guest.MARK} pid 7", f"{guest.MARK} moment 1.0",
                     "7 7 1 1000 3000 73 0 0 ffff1 ffff1 p",
                     "9 9 1 1000 3000 73 0 0 ffff2 ffff2 db", "9 9 1 3000 5000 73 0 0 ffff2 ffff2 db",
                     f"{guest.MARK} exit 0", f"{guest.MARK} words done"])
    ran = guest.parse(out, ["p"], 2, 1.0, "debian:6.12")
    assert ran.moments[0].processes == 2 and ran.moments[0].largest_group == 2
    with pytest.raises(MmlabError, match="a step before it failed in the guest: step failed"):
        guest.parse(f"{guest.MARK} failed step failed (status 1): cc\n", ["p"], 1, 1.0, "k")


@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="needs QEMU")
def test_a_guest_runs_programs_from_the_host_root_read_only(k612):
    """virtiofsd serves / and the guest mounts it read-only: the host's own
    programs run there, and nothing the guest writes reaches the host."""
    script = (f"MMLAB_HERE=/\n{hostroot.MOUNT}\n"
              "chroot /host sh -c 'id -un postgres; touch /etc/mmlab-was-here || echo read-only; "
              "touch /tmp/mmlab-work/x && echo tmp-writable'\n")
    out = run_script(Guest(k612, memory_mb=512, timeout_s=120, host_root=True), script)
    assert out.split() == ["postgres", "read-only", "tmp-writable"]
    assert not Path("/etc/mmlab-was-here").exists()


def test_the_files_a_command_names_travel_with_it(tmp_path):
    script = tmp_path / "work" / "jit.js"
    script.parent.mkdir()
    script.write_text("1\n")
    argv, files = guest.travelling(["cat", "-n", str(script), "30"], tmp_path / "cache")
    assert argv[1] == "-n" and argv[3] == "30"
    cat, kept = Path(argv[0]), Path(argv[2])
    assert cat.name == "cat" and cat.is_relative_to(tmp_path / "cache")
    assert kept.read_text() == "1\n" and kept.is_relative_to(tmp_path / "cache")
    assert {cat, kept} <= set(files) and any(f.name.startswith("libc.so") for f in files)


def test_a_guest_writes_the_settings_and_reports_ksm():
    text = guest.script(["/p"], Path("/m"), 0.5, HostSettings(ksm={"run": 1}))
    assert text.index("echo 1 > /sys/kernel/mm/ksm/run") < text.index("/p > /tmp/cmd.out")
    out = "\n".join([f"{guest.MARK} pid 7", f"{guest.MARK} moment 1.0",
                     "7 7 1 1000 3000 73 0 0 ffff1 ffff1 p", f"{guest.MARK} ksm 1 42",
                     f"{guest.MARK} moment 1.5", "7 7 1 1000 3000 73 0 0 ffff1 ffff1 p",
                     f"{guest.MARK} ksm 0 0", f"{guest.MARK} exit 0",
                     f"{guest.MARK} words done=1"])
    ran = guest.parse(out, ["p"], 1, 2.0, "debian:6.12")
    assert [s.ksm_pages_sharing for s in ran.moments] == [42, None]
    # the census at the command's exit reads KSM too, so no moment lacks it
    last = text[text.rindex(f"{guest.MARK} moment"):]
    assert last.index("/tmp/held") < last.index(f"{guest.MARK} ksm") < last.index("exit $code")
    assert ran.output == "done=1" and ran.peak.processes[0].largest_group == 1


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="needs QEMU")
def test_the_guest_census_sees_exactly_n_vmas(k612, tmp_path):
    static = tmp_path / "splitter"
    subprocess.run(["cc", "-O2", "-static", "-o", str(static), str(SPLITTER)], check=True)
    ran = guest.survey("debian:6.12", [str(static), "1001", "guard", "2"], interval_s=0.5, top=1)
    assert ran.exit_code == 0 and ran.peak.kernel.startswith("debian:6.12")
    (first, *_) = ran.peak.processes
    assert (first.comm, first.largest_group, first.groups[0].anon_vmas) == ("splitter", 1001, 1)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="needs QEMU")
def test_a_recipe_runs_in_a_guest_with_its_settings_there(k612, tmp_path):
    """The prepare step runs here, the dynamically linked program travels,
    the recipe's KSM setting is written in the guest and not on the host."""
    host_ksm = Path("/sys/kernel/mm/ksm/run").read_text()
    path = tmp_path / "r.toml"
    path.write_text(f"""description = "splitter in a guest, ksmd running there"
prepare = [["cc", "-O2", "-o", "{{work}}/splitter", "{SPLITTER}"]]
command = ["{{work}}/splitter", "301", "guard", "2"]
[settings]
ksm = {{ run = 1 }}
[guest]
memory_mb = 512
""")
    ran = recipe.survey(path, top=1, kernel="debian:6.12")
    assert ran.exit_code == 0 and ran.peak.kernel.startswith("debian:6.12")
    assert ran.peak.processes[0].largest_group == 301
    assert all(s.ksm_pages_sharing is not None for s in ran.moments)
    assert Path("/sys/kernel/mm/ksm/run").read_text() == host_ksm


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="needs QEMU")
def test_a_recipe_runs_whole_in_a_guest_from_the_host_root(k612, tmp_path):
    """With root = "host" the compiler, the service and the command all run
    in the guest (in a chroot of this machine's root), {work} is the guest's
    own, and the service's tree is sampled with the command's."""
    shutil.copy(SPLITTER, tmp_path)     # under this machine's /tmp: {here} binds it in
    path = tmp_path / "r.toml"
    path.write_text("""description = "splitter built in the guest, a service beside it"
prepare = [["cc", "-O2", "-o", "{work}/splitter", "{here}/splitter.c"]]
command = ["{work}/splitter", "101", "guard", "3"]
[[services]]
command = ["sleep", "SERVICE_SECONDS"]
ready = ["test", "-x", "{work}/splitter"]
[guest]
memory_mb = 1024
root = "host"
""".replace("SERVICE_SECONDS", SERVICE_SECONDS))
    ran = recipe.survey(path, top=2, kernel="debian:6.12")
    assert ran.exit_code == 0 and ran.peak.kernel.startswith("debian:6.12")
    assert ran.peak.processes[0].largest_group == 101
    assert max(s.processes for s in ran.moments) == 2
    assert subprocess.run(["pgrep", "-f", f"^sleep {SERVICE_SECONDS}$"],
                          check=False).returncode == 1
