"""The guest's initramfs: busybox, the static mmwork, and an init that runs
one trial and sends its output back over the second serial port (and, for
an exec workload, its program with the shared libraries it loads).

The base archive is built once per (mmwork, busybox, init) and cached by
their hash.  Each trial appends a tiny archive holding /trial.sh: the kernel
unpacks concatenated cpio archives in order, so no rebuild is needed per
trial.  A trial that needs the kernel's own modules (zram, virtio_blk for
guest swap) gets a third archive between them, made once per kernel.  The
archives are written here in the "newc" format (what the kernel's initramfs
unpacker reads), so no cpio tool is needed.  A kernel kexec'd on a bare-metal
machine gets the same archives with kexec and its hooks added (kexec.py).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.workloads.build import mmwork_path

BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")

# /init: mount what the workloads read, run /trial.sh (or, when there is none,
# wait for it on ttyS1), and frame its stdout, stderr and exit status with a
# SHA-256 each; `deliver` sends the frames on ttyS1 and `finish` powers off,
# unless /mmlab/kexec.sh says otherwise (a kernel kexec'd on a bare-metal
# machine writes them to its disk and kexecs back: kexec.py).
INIT = r"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /tmp /usr/bin /usr/sbin /sbin /var/tmp
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
stty -F /dev/ttyS1 raw -echo 2>/dev/null
deliver() { cat /tmp/results > /dev/ttyS1; }
finish() { sync; poweroff -f; }
[ -e /mmlab/kexec.sh ] && . /mmlab/kexec.sh
if [ ! -e /trial.sh ]; then
    # A guest booted to be saved (snapshot.py): every copy restored from it
    # reads its own trial here, a line with the size, then that much base64.
    echo "MMLAB-READY" > /dev/ttyS1
    { read -r size; head -c "$size" | base64 -d > /trial.sh; } < /dev/ttyS1
fi
echo "mmlab-guest: running trial" > /dev/ttyS0
sh /trial.sh > /tmp/stdout 2> /tmp/stderr
echo $? > /tmp/rc
for f in rc stdout stderr; do
    sum=$(sha256sum < /tmp/$f | cut -d' ' -f1)
    size=$(wc -c < /tmp/$f)
    echo "MMLAB-FRAME $f $sum $size"; base64 < /tmp/$f; echo "MMLAB-END $f"
done > /tmp/results
echo "MMLAB-DONE" >> /tmp/results
deliver
finish
"""


def _newc_entry(out: io.BytesIO, ino: int, name: str, mode: int, data: bytes = b"") -> None:
    fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0]
    header = b"070701" + b"".join(f"{v:08x}".encode() for v in fields)
    out.write(header + name.encode() + b"\0")
    out.write(b"\0" * (-out.tell() % 4))
    out.write(data)
    out.write(b"\0" * (-out.tell() % 4))


def cpio(files: dict[str, tuple[int, bytes]]) -> bytes:
    """A newc archive of {path: (mode, data)}; directories have mode 0o040755."""
    out = io.BytesIO()
    for ino, (name, (mode, data)) in enumerate(sorted(files.items()), 1):
        _newc_entry(out, ino, name, mode, data)
    _newc_entry(out, 0, "TRAILER!!!", 0)
    return out.getvalue()


def packed(files: dict[str, tuple[int, bytes]], level: int = 6) -> bytes:
    """`files` as a gzip'd newc archive, with no timestamp in the gzip
    header: the same files give the same bytes on every machine and every
    day, so a bare-metal machine's staged library compares by digest."""
    return gzip.compress(cpio(files), compresslevel=level, mtime=0)


def busybox() -> Path:
    for cand in BUSYBOX_CANDIDATES:
        if Path(cand).is_file():
            return Path(cand)
    found = shutil.which("busybox")
    if not found:
        raise MmlabError("busybox not found: install busybox-static (make setup does)")
    return Path(found)


def base_archive(cache: Path) -> Path:
    """The cached gzip'd base archive for the current mmwork and busybox."""
    bb = busybox().read_bytes()
    if not _is_static(busybox()):
        raise MmlabError(f"{busybox()} is dynamically linked: install busybox-static")
    mmwork = mmwork_path().read_bytes()
    key = hashlib.sha256(bb + mmwork + INIT.encode()).hexdigest()[:16]
    path = cache / f"base-{key}.cpio.gz"
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    files = dict.fromkeys(("bin", "dev", "proc", "sys", "tmp", "sbin", "usr", "usr/bin",
                           "usr/sbin"), (0o040755, b""))
    files.update({"init": (0o100755, INIT.encode()), "bin/busybox": (0o100755, bb),
                  "bin/sh": (0o100755, bb), "bin/mmwork": (0o100755, mmwork)})
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(packed(files))
    tmp.rename(path)
    return path


def _is_static(path: Path) -> bool:
    """An ELF without a PT_INTERP program header needs no dynamic loader."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return False
    phoff = int.from_bytes(data[0x20:0x28], "little")
    phentsize = int.from_bytes(data[0x36:0x38], "little")
    phnum = int.from_bytes(data[0x38:0x3A], "little")
    return all(int.from_bytes(data[phoff + i * phentsize: phoff + i * phentsize + 4], "little")
               != 3 for i in range(phnum))


def modules_archive(kernel) -> Path:
    """A gzip'd archive of the kernel's stored modules under
    /lib/modules/mmlab/, made once and kept beside the kernel."""
    path = Path(kernel.dir) / "modules.cpio.gz"
    if path.exists():
        return path
    files = dict.fromkeys(("lib", "lib/modules", "lib/modules/mmlab"), (0o040755, b""))
    for name in kernel.modules:
        files[f"lib/modules/mmlab/{name}.ko"] = (0o100644,
                                                  (Path(kernel.dir) / "modules" / f"{name}.ko")
                                                  .read_bytes())
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(packed(files))
    tmp.rename(path)
    return path


def files_archive(paths: list[Path], cache: Path) -> Path:
    """A gzip'd archive holding each of `paths` at the same absolute path (an
    exec workload's program and the shared libraries it loads, so that its
    dynamic loader finds them where it looks on the host), made once per
    set of contents and cached by their hash."""
    return archive({str(path).lstrip("/"): (0o100755, path.read_bytes()) for path in paths},
                   cache)


def archive(files: dict[str, tuple[int, bytes]], cache: Path) -> Path:
    """A gzip'd archive of {path: (mode, data)} with the directories they
    need, made once per set of contents and cached by their hash."""
    h = hashlib.sha256()
    tree = dict(files)
    for name, (mode, data) in sorted(files.items()):
        h.update(name.encode() + b"\0" + oct(mode).encode() + hashlib.sha256(data).digest())
        for parent in Path(name).parents:
            if str(parent) != ".":
                tree.setdefault(str(parent), (0o040755, b""))
    out = cache / f"files-{h.hexdigest()[:16]}.cpio.gz"
    if not out.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(packed(tree))
        tmp.rename(out)
    return out


def trial_initrd(base: Path, script: str | None, dest: Path,
                 extra: list[Path] | None = None) -> Path:
    """base archive (+ extra archives, such as a kernel's modules) + a last
    gzip'd archive holding /trial.sh, in one file; with no `script`, the
    guest's /init waits for its trial on ttyS1 (a guest to be saved).

    The kernel starts each further archive at a 4-byte boundary after zero
    padding, so each part is padded before the next is appended."""
    data = b""
    for part in [base, *(extra or [])]:
        data += part.read_bytes()
        data += b"\0" * (-len(data) % 4)
    if script is not None:
        data += script_archive(script)
    dest.write_bytes(data)
    return dest


def script_archive(script: str) -> bytes:
    """The last part of a trial's initramfs: a gzip'd archive of /trial.sh
    (a bare-metal machine's agent appends it to the kernel's own parts)."""
    return packed({"trial.sh": (0o100755, script.encode())}, level=9)
