"""What runs on a bare-metal machine: its agent, the hooks of a kernel kexec'd
there for a trial, their initramfs parts, and the raw disk they share.

The agent runs on the machine's base kernel (as the /trial.sh of mmlab's own
/init, initramfs.py).  For each trial the coordinator sends over the serial
channel, it reads the kernel under test and its initramfs parts from the
disk, appends the trial's /trial.sh, and `kexec -l ... && kexec -e`s into that
kernel.  There the same /init runs the trial with the same mmwork and frames
its results as in a guest; /mmlab/kexec.sh, sourced by /init, makes
`deliver` write the frames to the disk and `finish` kexec back to the base
kernel, whose agent sends them to the coordinator.  Each step says a
marker line on the channel (MMLAB-KEXEC, MMLAB-UP, MMLAB-RAN, MMLAB-KEXEC
back, MMLAB-AGENT-UP), which the coordinator times (agentlink.py).  A
kernel that cannot kexec back, or a machine wired to come back by its boot
loader, says MMLAB-REBOOT and reboots instead: the boot loader starts the
base kernel, whose agent sends the results the disk kept.

The disk (a whole disk or a partition) holds, raw (a kernel under test
needs no filesystem driver to use it): a header line at byte 0 naming the
trial whose results follow it (or that is pending), the results from byte
4096, the library's index at LIBRARY (a "MMLAB-LIBRARY" line, so that no
other disk is ever written, then one "name offset size" line per file),
and the library's files, each at a MiB boundary: the base kernel to come
back to with its initramfs and command line, every kernel under test with
its initramfs parts, and a manifest naming each kernel with a digest of
its files, which the agent reads out when the coordinator says hello.
Results carry the trial's nonce, so results a machine kept from an earlier
trial are never taken for this one's.

How a machine is wired (its channel's tty, its disk, the modules its
kernels load, how it comes back) is a Wiring: the simulated
machine's (simulated.py) is ttyS1, /dev/vda and virtio_blk; a real
machine's comes from its machine file (realmachine.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.kernels import images
from mmlab.targets import initramfs
from mmlab.workloads.execwork import shared_libraries

KEXEC = Path("/usr/sbin/kexec")      # kexec-tools' (make setup installs it)
MIB = 1 << 20
HEADER = 4096                        # the header block; the results follow it
LIBRARY = 64 * MIB                   # the index; the results must end before it
FIRST_FILE = LIBRARY + MIB
MAGIC = "MMLAB-LIBRARY"
MODULES_ORDER = "lib/modules/mmlab/machine.order"    # the machine's modules, in load order
BACK = ("kexec", "reboot")


@dataclass(frozen=True)
class Wiring:
    """How a machine is wired: the machine's end of the agent's serial line
    (and its speed, where it has one), its library disk (a shell pattern:
    the agent takes the one that holds an mmlab library, since kernels may
    name disks in another order), the modules its kernels load before
    anything else (the disk's driver, a CPU frequency driver), and how a
    trial's kernel comes back (kexec, or a reboot through the boot loader)."""
    channel: str = "/dev/ttyS1"
    disk: str = "/dev/vda"
    modules: tuple[str, ...] = ("virtio_blk",)
    baud: int | None = None
    back: str = "kexec"


def machine_script(wiring: Wiring) -> str:
    """Shared by the agent and a kernel under test: how the machine is
    wired, and the functions that use the channel and the disk."""
    return (f"# mmlab's bare-metal machine (kexec.py): its channel and its disk\n"
            f"CHANNEL={wiring.channel}\nDISKS=\"{wiring.disk}\"\nDISK=\n"
            f"SPEED={wiring.baud or ''}\nBACK={wiring.back}\nKEXEC={KEXEC}\n{FUNCTIONS}")


# Reading and writing what the disk holds; offsets are in bytes.
FUNCTIONS = rf"""say() {{ echo "$*" >> "$CHANNEL"; }}
channel_ready() {{ stty -F "$CHANNEL" $SPEED raw -echo -ixon 2>/dev/null; }}
# disk_ready: the machine's modules loaded and the disk that holds a library found
disk_ready() {{
    for m in $(cat /{MODULES_ORDER} 2>/dev/null); do
        insmod /lib/modules/mmlab/$m.ko 2>/dev/null
    done
    for i in $(seq 100); do
        for d in $DISKS; do
            case "$(dd if="$d" bs={MIB} skip={LIBRARY // MIB} count=1 2>/dev/null \
                    | head -n 1)" in
                "{MAGIC} "*) DISK=$d; return 0 ;;
            esac
        done
        sleep 0.1
    done
    return 1
}}
# fetch NAME DEST: a file of the library the coordinator wrote on the disk
fetch() {{
    set -- $(dd if="$DISK" bs={MIB} skip={LIBRARY // MIB} count=1 2>/dev/null \
             | tr -d '\000' | grep "^$1 ") "$2"
    [ $# -eq 4 ] && dd if="$DISK" of="$4" bs={MIB} iflag=skip_bytes,count_bytes \
        skip="$2" count="$3" 2>/dev/null
}}
header() {{ dd if="$DISK" bs={HEADER} count=1 2>/dev/null | head -n 1 | tr -d '\000'; }}
mark() {{ echo "$*" | dd of="$DISK" bs={HEADER} count=1 conv=sync,notrunc,fsync 2>/dev/null; }}
# put_results NONCE FILE: the trial's frames after the header that names them
put_results() {{
    size=$(wc -c < "$2")
    if [ "$size" -gt {LIBRARY - HEADER} ]; then
        mark "MMLAB-TOOBIG $1 $size"
    else
        dd if="$2" of="$DISK" bs={MIB} seek={HEADER} oflag=seek_bytes conv=notrunc,fsync \
            2>/dev/null
        mark "MMLAB-RESULTS $1 $size"
    fi
    sync
}}
# send_results: the results the disk holds (or what became of its trial), once
send_results() {{
    set -- $(header)
    case "$1" in
        MMLAB-RESULTS)
            say "MMLAB-RESULTS $2 $3"
            dd if="$DISK" bs={MIB} iflag=skip_bytes,count_bytes skip={HEADER} count="$3" \
                2>/dev/null >> "$CHANNEL" ;;
        MMLAB-TOOBIG) say "MMLAB-ERROR $2 results of $3 bytes did not fit the disk" ;;
        MMLAB-PENDING) say "MMLAB-LOST $2" ;;
    esac
    mark ""
}}
"""

# The agent, on the base kernel: send what the last trial left, then take one
# request at a time: a trial, or a hello (what the machine is and what its
# library holds).  The channel is opened before READY is said, so no byte
# of the request arrives while nobody reads the port.
AGENT = r"""# mmlab's bare-metal agent (kexec.py)
. /mmlab/machine.sh
channel_ready
say "MMLAB-AGENT-UP $(uname -r)"
disk_ready || { say "MMLAB-AGENT-ERROR no library disk among $DISKS"; exit 1; }
send_results
hello() {
    say "MMLAB-MACHINE $(grep -c ^processor /proc/cpuinfo)" \
        "$(sed -n 's/^MemTotal: *\([0-9]*\).*/\1/p' /proc/meminfo) $(uname -r)" \
        "$(sed -n 's/^model name[^:]*: *//p' /proc/cpuinfo | head -n 1)"
    fetch manifest /tmp/manifest && while read -r line; do
        say "MMLAB-ENTRY $line"
    done < /tmp/manifest
}
while :; do
    verb=
    { say "MMLAB-AGENT-READY"
      read -r verb entry nonce size
      if [ "$verb" = MMLAB-TRIAL ]; then
          read -r append
          head -c "$size" | base64 -d > /tmp/trial.cpio.gz
      fi
    } < "$CHANNEL"
    case "$verb" in
        MMLAB-QUIT) exit 0 ;;
        MMLAB-HELLO) hello; continue ;;
        MMLAB-TRIAL) ;;
        *) say "MMLAB-AGENT-ERROR not a request: $verb"; continue ;;
    esac
    if ! fetch "$entry.vmlinuz" /tmp/vmlinuz || ! fetch "$entry.initrd" /tmp/initrd; then
        say "MMLAB-AGENT-ERROR $entry is not on the disk"; continue
    fi
    cat /tmp/trial.cpio.gz >> /tmp/initrd
    mark "MMLAB-PENDING $nonce"
    if ! out=$($KEXEC -l /tmp/vmlinuz --initrd=/tmp/initrd \
               --append="$append mmlab.trial=$nonce" 2>&1); then
        mark ""
        say "MMLAB-AGENT-ERROR kexec -l $entry failed: $(echo $out)"; continue
    fi
    rm -f /tmp/vmlinuz /tmp/initrd /tmp/trial.cpio.gz
    say "MMLAB-KEXEC $entry"
    sync
    $KEXEC -e
    mark ""
    say "MMLAB-AGENT-ERROR kexec -e into $entry returned"
done
"""

# A kernel under test, sourced by /init: say it runs, find the disk, and make
# the trial's results go to the disk and the kernel kexec back to the base.
# A machine wired to come back by its boot loader, or a kernel with no way
# back by kexec, says MMLAB-REBOOT and reboots: the boot loader starts the
# base kernel, whose agent sends the results the disk kept.
HOOKS = r"""# a kernel kexec'd by mmlab's bare-metal agent (kexec.py)
. /mmlab/machine.sh
channel_ready
nonce=$(sed -n 's/.*mmlab\.trial=\([^ ]*\).*/\1/p' /proc/cmdline)
say "MMLAB-UP $nonce $(uname -r)"
disk_ready || say "MMLAB-ERROR $nonce no library disk among $DISKS under $(uname -r)"
deliver() { put_results "$nonce" /tmp/results; say "MMLAB-RAN $nonce"; }
# kexec_back: into the base kernel; when it cannot, why not (on stdout)
kexec_back() {
    if ! fetch base.vmlinuz /tmp/vmlinuz || ! fetch base.initrd /tmp/initrd \
            || ! fetch base.append /tmp/append; then
        echo "no base kernel on the disk"; return
    fi
    if ! out=$($KEXEC -l /tmp/vmlinuz --initrd=/tmp/initrd --append="$(cat /tmp/append)" \
               2>&1); then
        echo "kexec -l: $out"; return
    fi
    rm -f /tmp/vmlinuz /tmp/initrd
    say "MMLAB-KEXEC back"
    sync
    $KEXEC -e
    echo "kexec -e returned"
}
finish() {
    why="wired to come back by the boot loader"
    [ "$BACK" = kexec ] && why="no way back by kexec: $(kexec_back)"
    say "MMLAB-REBOOT $nonce $(echo $why)"
    sync
    reboot -f
}
"""


def tools_archive(wiring: Wiring, cache: Path) -> Path:
    """kexec with the shared libraries it loads (packed at their host paths,
    as an exec workload's program is) and the machine's shell functions."""
    if not KEXEC.exists():
        raise MmlabError(f"{KEXEC}: not installed (make setup installs kexec-tools)")
    files = {str(p).lstrip("/"): (0o100755, p.read_bytes())
             for p in (KEXEC, *shared_libraries(KEXEC))}
    files["mmlab/machine.sh"] = (0o100644, machine_script(wiring).encode())
    return initramfs.archive(files, cache)


def machine_modules_archive(kernel: images.Kernel, wiring: Wiring, cache: Path,
                            say: Callable[[str], None]) -> Path:
    """The modules the machine needs under `kernel`, with their load order."""
    found = images.machine_modules(kernel, wiring.modules, say)
    files = {f"lib/modules/mmlab/{name}.ko": (0o100644, data) for name, data in found.items()}
    files[MODULES_ORDER] = (0o100644, "".join(f"{name}\n" for name in found).encode())
    return initramfs.archive(files, cache)


def agent_initrd(base: images.Kernel, wiring: Wiring, cache: Path, dest: Path,
                 say: Callable[[str], None]) -> Path:
    """The base kernel's initramfs: mmlab's /init running the agent."""
    return initramfs.trial_initrd(initramfs.base_archive(cache), AGENT, dest,
                                  [initramfs.modules_archive(base),
                                   machine_modules_archive(base, wiring, cache, say),
                                   tools_archive(wiring, cache)])


def kernel_initrd(kernel: images.Kernel, wiring: Wiring, cache: Path, dest: Path,
                  say: Callable[[str], None]) -> Path:
    """A kernel under test's initramfs but its /trial.sh, which the agent
    appends (each part padded, so the trial's archive follows as is)."""
    hooks = initramfs.archive({"mmlab/kexec.sh": (0o100644, HOOKS.encode())}, cache)
    return initramfs.trial_initrd(initramfs.base_archive(cache), None, dest,
                                  [initramfs.modules_archive(kernel),
                                   machine_modules_archive(kernel, wiring, cache, say),
                                   tools_archive(wiring, cache), hooks])


def library(base: images.Kernel, append: str, kernels: Sequence[images.Kernel],
            wiring: Wiring, cache: Path, tmp: Path,
            say: Callable[[str], None]) -> dict[str, Path | bytes]:
    """A machine's library: the base kernel with the agent's initramfs and
    the command line it boots with, each of `kernels` (entries k1, k2, ...)
    with its initramfs parts, and the manifest: one "entry digest kernel"
    line each."""
    files: dict[str, Path | bytes] = {
        "base.vmlinuz": base.image, "base.append": append.encode(),
        "base.initrd": agent_initrd(base, wiring, cache, tmp / "base.initrd", say)}
    manifest = [f"base {digest(files, 'base')} {base.name}\n"]
    for entry, kernel in ((f"k{i}", k) for i, k in enumerate(kernels, 1)):
        files[f"{entry}.vmlinuz"] = kernel.image
        files[f"{entry}.initrd"] = kernel_initrd(kernel, wiring, cache, tmp / f"{entry}.initrd",
                                                 say)
        manifest.append(f"{entry} {digest(files, entry)} {kernel.name}\n")
    files["manifest"] = "".join(manifest).encode()
    return files


def held(files: Mapping[str, Path | bytes]) -> dict[str, tuple[str, str]]:
    """What a library holds, read from its manifest (see `read`)."""
    text = files["manifest"]
    assert isinstance(text, bytes)
    return read([line.split() for line in text.decode().splitlines()])


def read(manifest: list[list[str]]) -> dict[str, tuple[str, str]]:
    """A manifest's lines ("entry digest kernel", split) by what they hold:
    "base" for the base kernel, else the kernel's name -> (entry, digest)."""
    return {"base" if entry == "base" else kernel: (entry, digest)
            for entry, digest, kernel in (line[:3] for line in manifest if len(line) >= 3)}


def digest(files: Mapping[str, Path | bytes], entry: str) -> str:
    """What the library holds for `entry`, in 16 hex digits, whatever its
    entry is called: a machine's library is current when the manifest it
    reads out says the same for the kernel."""
    h = hashlib.sha256()
    for name in sorted(n for n in files if n.startswith(f"{entry}.")):
        content = files[name]
        h.update(name.removeprefix(entry).encode() + b"\0")
        h.update(content if isinstance(content, bytes) else content.read_bytes())
    return h.hexdigest()[:16]


def disk(dest: Path, files: Mapping[str, Path | bytes], label: str) -> Path:
    """The machine's disk: an empty header and results area, then the
    library's index (its MAGIC line naming the machine first) and `files`
    (name -> a file or bytes), sparse."""
    index, at = [f"{MAGIC} {label}\n"], FIRST_FILE
    with open(dest, "wb") as out:
        for name, content in files.items():
            data = content if isinstance(content, bytes) else content.read_bytes()
            out.seek(at)
            out.write(data)
            index.append(f"{name} {at} {len(data)}\n")
            at += -(-len(data) // MIB) * MIB
        out.seek(LIBRARY)
        out.write("".join(index).encode())
        out.truncate(max(at, FIRST_FILE))
    return dest
