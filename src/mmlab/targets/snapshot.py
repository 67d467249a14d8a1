"""A booted guest, saved once and restored for every trial.

Booting a Debian kernel under TCG costs about 4 s, most of a guest trial.
So each (kernel, guest shape, initramfs) is booted once with no trial in its
initramfs: /init says MMLAB-READY on ttyS1 and waits there for a trial.  The
guest is then saved with QEMU's migration to a zstd-compressed file (QMP
`migrate` to `exec:`), and every trial starts a QEMU that loads that file
(`-incoming`), waits until the guest runs again, and sends its /trial.sh
down ttyS1 over a socket.  The guest reads it, runs it, and frames its
results back on the same port; the checks are boot.py's.

Every trial restored from one saved boot starts from the same memory, page
cache and free lists, so trials are at least as alike as booted ones; whether
they measure the same is an experiment (experiments/aa-guest-snapshot.toml),
not an assumption.  Where a path's cost depends on the state a boot leaves,
one saved boot freezes one draw of it into every trial (a report had
debian:6.1's zap at 1,151 kernel instructions per page from one saved boot
and 1,304 from another; 9 new saved boots here all gave 1,302 to 1,318, and
the lower value came from a run now and then: docs/findings.md, "State-
sensitive paths").  So a kernel has several saved boots
(`states`: 3 where the profile counts), each made once and cached, and a
trial takes its round's (`rotation`); its samples name it (`guest_state`),
so the judge and the audit see the spread between boots; attribution
counts the kernel's instructions by function from each of those boots
(`by_function`), so the audit names the functions where they disagree.
The script is sent only once the guest runs: bytes that reach the serial
port while the state is still loading are lost.

QMP is spoken through qemu.qmp, the QEMU project's own client library.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shlex
import subprocess
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, cast

from qemu.qmp import QMPClient
from qemu.qmp.error import QMPError

from mmlab.errors import MmlabError
from mmlab.judge.states import STATE_FUNCTIONS
from mmlab.machine import paths
from mmlab.targets import initramfs, snapcache
from mmlab.targets.boot import (
    BOOT_RETRIES,
    CMDLINE,
    BootFailed,
    BootResult,
    Guest,
    QemuExit,
    connect,
    failure,
    plugin_args,
    qemu_argv,
    qemu_version,
    read_text,
    repeated,
    result,
    retrying,
    start_qemu,
    still_starting,
    swap_disk,
    swap_disk_size,
    tail,
    trial_parts,
    wait_qemu,
)
from mmlab.workloads import insns
from mmlab.workloads.mmwork import TrialFailed

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Set

    from mmlab.attribution.functions import FunctionInsns
    from mmlab.experiment.plan import Arm, Plan

READY = "MMLAB-READY"
COUNTED_STATES = 3   # saved boots per kernel where a profile counts: the default
SAVE_TIMEOUT_S = 120


class SnapshotUnavailable(MmlabError):
    """No snapshot could be made: trials boot instead, and say so."""


class Vanished(SnapshotUnavailable):
    """The snapshot was gone when its restore began (removed by hand, or by
    a process that does not lock it): made again once, then booted."""


# Snapshots this process failed to make (the saves already retried a boot
# that died early): the trials after the first boot at once rather than
# boot twice more to be saved, e.g. every trial of a command line that
# panics the kernel.  Per process: a later run tries again.
_UNSAVED: dict[Path, SnapshotUnavailable] = {}


@dataclass(frozen=True)
class Snapshot:
    """A saved guest: the initramfs it booted from and its migrated state."""
    dir: Path

    @property
    def initrd(self) -> Path:
        return self.dir / "initrd"

    @property
    def state(self) -> Path:
        return self.dir / "state.zst"

    @property
    def made(self) -> Path:
        """A name of this save's own, so a boot saved again is told apart."""
        return self.dir / "made"

    def label(self, index: int) -> str:
        """The `guest_state` of its trials: "INDEX:ID"."""
        made = self.made.read_text().strip() if self.made.exists() else self.dir.name[:12]
        return f"{index}:{made}"


def states(plan: Plan) -> int:
    """The saved boots a plan's restored guests rotate over: the profile's
    guest_states, else COUNTED_STATES where it counts instructions (exact
    counts whose spread would otherwise be one boot's), or 2 where that
    many divide its planned rounds and 3 do not (the tracker's 4-round
    cells), so each boot starts as many rounds; else one: a timed trial's
    own noise is larger than the boots' differences seen so far."""
    if plan.profile.guest_states:
        return plan.profile.guest_states
    if not insns.wanted(plan.workload, plan.profile.metrics):
        return 1
    rounds = plan.profile.repetitions
    return 2 if rounds % 2 == 0 and rounds % COUNTED_STATES else COUNTED_STATES


def rotation(arm: Arm, plan: Plan) -> int:
    """The saved boot the arm's trial starts from: its round's turn, so the
    arms of a round take their kernels' boots of one index (a pair shares
    it) and each arm sees every boot equally often over a multiple of
    `states` rounds."""
    return arm.round % states(plan)


def by_function(arm: Arm, plan: Plan, wanted: Set[str],
                count: Callable[[int], FunctionInsns | None]) -> dict[str, dict]:
    """An arm's attribution by function (`count(k)`: counted from saved
    boot k, None if it could not be): its first boot's counts as
    `functions`, and where `wanted` has STATE_FUNCTIONS and its trials
    start from several saved boots, each of those boots' counts by function
    (by index), so that the audit names the functions where its boots
    disagree (judge/states.py).  Each boot costs an attribution boot (one
    took 3.5 counting trials' time here), so the tracker, which asks for
    `functions` alone, does not count them."""
    first = count(0)
    if first is None:
        return {}
    several = arm.guest_start == "snapshot" and STATE_FUNCTIONS in wanted
    n = min(states(plan), plan.profile.repetitions) if several else 1
    each = {"0": first.windows} | {str(k): f.windows for k in range(1, n) if (f := count(k))}
    return {"functions": first.model_dump()} | ({STATE_FUNCTIONS: each} if n > 1 else {})


def snapshot_root(cache: Path) -> Path:
    return cache.parent / "snapshots"


def _key(guest: Guest, accel: str, disk: int, parts: list[Path]) -> str:
    """Everything the saved state depends on: QEMU, the accelerator, the
    guest's shape, the kernel image and the initramfs parts, each file by
    path, size and modification time (the base and program archives are
    named by their content already), so keying a trial reads no file."""
    files = [guest.kernel.image, *parts]
    stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    # The first saved boot keeps the key it had before boots were several.
    index = [guest.state] if guest.state else []
    return hashlib.sha256(json.dumps([
        qemu_version(), accel, guest.vcpus, guest.memory_mb, guest.numa_nodes,
        CMDLINE, guest.extra_cmdline, disk, stats, *index,
    ]).encode()).hexdigest()[:20]


def restored(guest: Guest, script: str, accel: str, cache: Path, swap: str | None,
             archives: tuple[Path, ...], plugin: Path | None,
             plugin_extra: tuple[str, ...] = ()) -> tuple[BootResult, int]:
    """A trial restored from its snapshot (made first if need be) and how
    many starts it retried: the snapshot is held from its lookup to the
    trial's end, so no prune removes it; one that vanished anyway is made
    again, once, and that counts as a retry (`boot_retries`)."""
    try:
        return _restored_once(guest, script, accel, cache, swap, archives, plugin, plugin_extra)
    except Vanished:
        boot, retry = _restored_once(guest, script, accel, cache, swap, archives, plugin,
                                     plugin_extra)
        return boot, retry + 1


def _restored_once(guest: Guest, script: str, accel: str, cache: Path, swap: str | None,
                   archives: tuple[Path, ...], plugin: Path | None,
                   plugin_extra: tuple[str, ...]) -> tuple[BootResult, int]:
    """restored's trial from the snapshot as it is held now."""
    with held(guest, accel, cache, swap, archives) as snap:
        return retrying(partial(restore, guest, snap, script, accel, swap, plugin,
                                plugin_extra))


@contextmanager
def held(guest: Guest, accel: str, cache: Path, swap: str | None,
         archives: tuple[Path, ...]) -> Iterator[Snapshot]:
    """The snapshot for this guest and its state index, in use (snapcache)
    until the block ends; made now (one boot and a save, under a lock so
    that parallel trials make it once) if it is not kept yet; one this
    process could not make is not tried again (_UNSAVED)."""
    parts = [initramfs.base_archive(cache), *trial_parts(guest, swap, archives)]
    snap = Snapshot(snapshot_root(cache) / _key(guest, accel, swap_disk_size(swap), parts))
    if snap.dir in _UNSAVED:
        raise _UNSAVED[snap.dir]
    with snapcache.in_use(snap.dir):
        made = False
        with paths.filling(snap.state):
            if not snap.state.exists():
                initramfs.trial_initrd(parts[0], None, snap.initrd, parts[1:])
                try:
                    _save_retrying(guest, accel, snap, swap)
                except SnapshotUnavailable as exc:
                    _UNSAVED[snap.dir] = exc
                    raise
                snap.made.write_text(uuid.uuid4().hex[:12] + "\n")
                made = True
        if made:
            snapcache.prune(snap.dir.parent)
        yield snap


def _save_retrying(guest: Guest, accel: str, snap: Snapshot, swap: str | None) -> None:
    """_save, tried again when the kernel died before /init, as a boot is
    (boot.boot_retrying): an emulated boot now and then panics early (seen
    here on 6.12 and 6.18 under TCG) and the next one is fine."""
    before: BaseException | None = None
    for retry in range(BOOT_RETRIES + 1):
        try:
            _save(guest, accel, snap, swap)
            return
        except SnapshotUnavailable as exc:
            cause = exc.__cause__
            if not isinstance(cause, BootFailed) or retry == BOOT_RETRIES \
                    or repeated(before, cause):
                raise
            before = cause


def _save(guest: Guest, accel: str, snap: Snapshot, swap: str | None) -> None:
    """Boot the waiting guest, and once it says READY, migrate it to the
    snapshot's file and quit."""
    with tempfile.TemporaryDirectory(prefix="mmlab-save-") as tmp:
        tmpd = Path(tmp)
        console, results, qmp = tmpd / "console.log", tmpd / "results.log", tmpd / "qmp.sock"
        argv = qemu_argv(guest, snap.initrd, accel, console, ["-serial", f"file:{results}"],
                         swap_disk(tmpd, swap)) + ["-qmp", f"unix:{qmp},server=on,wait=off"]
        t0 = time.monotonic()
        proc = start_qemu(argv, accel, guest.vcpus)
        try:
            while READY not in read_text(results):
                if proc.poll() is not None or time.monotonic() - t0 > SAVE_TIMEOUT_S:
                    text = read_text(console)
                    failed = failure(text)
                    raise BootFailed(f"{guest.kernel.name} did not reach /init to be saved; "
                                     f"console: {tail(text)}", failed[1] if failed else None)
                time.sleep(0.05)
            partial = snap.state.with_suffix(".partial")
            # The file is renamed by the writer once zstd is done: QEMU
            # reports "completed" when its side of the pipe is written.
            uri = (f"exec:zstd -1 -q -c > {shlex.quote(str(partial))} && "
                   f"mv {shlex.quote(str(partial))} {shlex.quote(str(snap.state))}")
            asyncio.run(_migrate(qmp, uri))
            proc.terminate()            # the saved guest stays paused: its QEMU is done
            ended = wait_qemu(proc, SAVE_TIMEOUT_S, t0)
        except (QMPError, OSError, EOFError, TrialFailed, SnapshotUnavailable) as exc:
            proc.kill()
            proc.wait()
            raise SnapshotUnavailable(f"{guest.kernel.name} could not be saved: "
                                      f"{exc or type(exc).__name__}") from exc
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    while not snap.state.exists():
        if ended.hung or time.monotonic() - t0 > SAVE_TIMEOUT_S:
            raise SnapshotUnavailable(f"{guest.kernel.name} could not be saved: "
                                      "no state written")
        time.sleep(0.02)


async def _query(qmp: QMPClient, command: str) -> dict[str, object]:
    """A QMP query's answer, a JSON object (qemu.qmp types every answer as object)."""
    return cast(dict[str, object], await qmp.execute(command))


async def _migrate(qmp_socket: Path, uri: str) -> None:
    """QMP: migrate the running guest to `uri` and wait for the end."""
    qmp = QMPClient("mmlab")
    await qmp.connect(str(qmp_socket))
    try:
        await qmp.execute("migrate", {"uri": uri})
        while (info := await _query(qmp, "query-migrate")).get("status") not in (
                "completed", "failed", "cancelled"):
            await asyncio.sleep(0.02)
    finally:
        await qmp.disconnect()
    if info.get("status") != "completed":
        raise SnapshotUnavailable(f"migration {info.get('status')}: "
                                  f"{info.get('error-desc', 'QEMU gave no reason')}")


def restore(guest: Guest, snap: Snapshot, script: str, accel: str, swap: str | None,
            plugin: Path | None = None, plugin_extra: tuple[str, ...] = ()) -> BootResult:
    """One trial in a guest restored from `snap`: QEMU loads the state,
    the script goes down ttyS1 once the guest runs, and the results come
    back on the same socket until QEMU exits.  The restore is the use
    that keeps a snapshot from the prune (its mtime)."""
    try:
        os.utime(snap.state)
    except FileNotFoundError as exc:
        raise Vanished(f"{snap.dir}: the saved boot vanished before its restore") from exc
    with tempfile.TemporaryDirectory(prefix="mmlab-guest-") as tmp:
        tmpd = Path(tmp)
        console, sock, qmp, counts = (tmpd / n for n in ("console.log", "results.sock",
                                                          "qmp.sock", "insns.jsonl"))
        results = ["-chardev", f"socket,id=results,path={sock},server=on,wait=off",
                   "-serial", "chardev:results"]
        argv = qemu_argv(guest, snap.initrd, accel, console, results, swap_disk(tmpd, swap)) + \
            plugin_args(plugin, counts, plugin_extra) + \
            ["-qmp", f"unix:{qmp},server=on,wait=off",
             "-incoming", f"exec:zstd -d -q -c {shlex.quote(str(snap.state))}"]
        t0 = time.monotonic()
        proc = start_qemu(argv, accel, guest.vcpus)
        try:
            got = _converse(proc, sock, qmp, script, t0 + guest.timeout_s)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        ended = wait_qemu(proc, guest.timeout_s, t0)
        if got is None:
            ended = QemuExit(ended.returncode, ended.stderr, True, ended.seconds)
        res = result(guest, read_text(console), got or "", ended, read_text(counts))
    res.start, res.state = "restored", snap.label(guest.state)
    return res


def _converse(proc: subprocess.Popen, sock: Path, qmp: Path, script: str,
              deadline: float) -> str | None:
    """Connect to the guest's ttyS1, wait until it runs, send the script,
    and read until QEMU closes the port; None if the deadline passed."""
    conn = connect(proc, sock, deadline)
    chunks: list[bytes] = []
    with conn:
        asyncio.run(_until_running(proc, qmp, deadline))
        try:
            conn.sendall(_encoded(script))
            while (left := deadline - time.monotonic()) > 0:
                conn.settimeout(left)
                data = conn.recv(1 << 16)
                if not data:
                    break
                chunks.append(data)
            else:
                return None
        except TimeoutError:
            return None
        except OSError:     # QEMU went away (a reset): what arrived is judged as it is
            pass
    return b"".join(chunks).decode(errors="replace")


def _encoded(script: str) -> bytes:
    """The script as /init reads it: its base64 size on a line, then the base64."""
    data = base64.encodebytes(script.encode())
    return f"{len(data)}\n".encode() + data


async def _until_running(proc: subprocess.Popen, qmp_socket: Path, deadline: float) -> None:
    """QMP: wait until the loaded guest runs again."""
    client = QMPClient("mmlab")
    while True:
        try:
            await client.connect(str(qmp_socket))
            break
        except (OSError, QMPError):
            still_starting(proc, deadline)
            await asyncio.sleep(0.005)
    try:
        while not (await _query(client, "query-status")).get("running"):
            still_starting(proc, deadline)
            await asyncio.sleep(0.005)
    finally:
        await client.disconnect()
