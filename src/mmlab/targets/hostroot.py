"""The host's root file system inside a guest, read-only, over virtiofs.

A program that loads far more than `ldd` names (a JVM reads its JDK tree,
PostgreSQL its share and lib trees, its users and PAM) cannot travel in an
initramfs.  Instead the guest mounts this machine's `/` read-only and runs
the program in a chroot of it, with fresh tmpfs over /tmp, /run and
/dev/shm, so nothing it writes reaches the host.  Debian's kernels build
virtiofs in (CONFIG_VIRTIO_FS=y), so the guest needs no module, and QEMU's
own virtiofsd (qemu-system-common) serves the tree: one daemon per guest,
which exits when its guest does.  virtiofs needs the guest's memory shared
with the daemon (a memfd backend): census guests only, never a timed trial.

virtiofsd's namespace sandbox cannot pivot_root inside a container, so the
daemon chroots into the tree instead (sandbox=chroot).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.kernels import images

VIRTIOFSD = Path("/usr/lib/qemu/virtiofsd")
TAG = "hostroot"
MOUNTED = "/host"          # where the guest's init mounts it; the chroot's root
SOCKET_WAIT_S = 10

# Guest shell lines: the tree read-only, and what a program writes on fresh
# tmpfs; `here` (a folder of the host's, possibly under its /tmp) is bound
# first, so it stays visible at /tmp/mmlab-here once /tmp is covered.
MOUNT = f"""mkdir -p {MOUNTED} /mmlab-here
mount -t virtiofs -o ro {TAG} {MOUNTED} ||
    {{ echo 'virtiofs: cannot mount the host root' >&2; exit 95; }}
mount --bind {MOUNTED}"$MMLAB_HERE" /mmlab-here
mount -t proc proc {MOUNTED}/proc
mount -t sysfs sysfs {MOUNTED}/sys
mount -t devtmpfs devtmpfs {MOUNTED}/dev
mkdir -p {MOUNTED}/dev/shm
for d in tmp run dev/shm; do mount -t tmpfs tmpfs {MOUNTED}/$d; done
mkdir -p {MOUNTED}/tmp/mmlab-here {MOUNTED}/tmp/mmlab-work
mount --bind /mmlab-here {MOUNTED}/tmp/mmlab-here
chmod 1777 {MOUNTED}/tmp {MOUNTED}/dev/shm
chmod 755 {MOUNTED}/tmp/mmlab-work
ip link set lo up 2>/dev/null
"""
HERE, WORK = "/tmp/mmlab-here", "/tmp/mmlab-work"     # {here} and {work} in the chroot


def check(kernel: images.Kernel) -> None:
    """Refuse, in one line, a guest that cannot mount the host's root."""
    if not VIRTIOFSD.exists():
        raise MmlabError(f"{VIRTIOFSD}: not installed (Debian's qemu-system-common ships it); "
                         "a guest cannot mount this machine's root without it")
    if kernel.option("CONFIG_VIRTIO_FS") != "y":
        raise MmlabError(f"{kernel.name}: CONFIG_VIRTIO_FS is not built in, so its guest "
                         "cannot mount this machine's root")


@contextmanager
def served(where: Path) -> Iterator[Path]:
    """virtiofsd serving `/` on a socket in `where`, for one guest."""
    sock, logged = where / "virtiofs.sock", where / "virtiofsd.log"
    with open(logged, "w") as log:
        daemon = subprocess.Popen([str(VIRTIOFSD), f"--socket-path={sock}", "-o", "source=/",
                                   "-o", "cache=auto", "-o", "sandbox=chroot"],
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + SOCKET_WAIT_S
            while not sock.exists():
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise MmlabError("virtiofsd did not start: "
                                     f"{logged.read_text().strip()[-200:]}")
                time.sleep(0.02)
            yield sock
        finally:
            daemon.kill()
            daemon.wait()


def qemu_args(sock: Path, memory_mb: int) -> list[str]:
    """The virtiofs device, and the shared memory it needs."""
    return ["-chardev", f"socket,id={TAG},path={sock}",
            "-device", f"vhost-user-fs-pci,chardev={TAG},tag={TAG}",
            "-object", f"memory-backend-memfd,id=shared,size={memory_mb}M,share=on",
            "-machine", "memory-backend=shared"]
