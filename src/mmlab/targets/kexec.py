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
back, MMLAB-AGENT-UP), which the coordinator times (agentlink.py).

The disk holds, raw (a kernel under test needs no filesystem driver to use
it): a header line at byte 0 naming the trial whose results follow it (or
that is pending), the results from byte 4096, an index of the library at
LIBRARY (one "name offset size" line per file), and the library's files,
each at a MiB boundary: the base kernel to come back to with its initramfs
and command line, and every kernel under test with its initramfs parts.
Results carry the trial's nonce, so results a machine kept from an earlier
trial are never taken for this one's.

The channel, the disk and its driver are the simulated machine's
(simulated.py): ttyS1, /dev/vda, virtio_blk (a module in Debian's kernels).
"""

from __future__ import annotations

from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.kernels import images
from mmlab.targets import initramfs
from mmlab.workloads.execwork import shared_libraries

CHANNEL = "/dev/ttyS1"
DISK = "/dev/vda"
DISK_MODULES = ("virtio_blk",)
KEXEC = Path("/usr/sbin/kexec")      # kexec-tools' (make setup installs it)
MIB = 1 << 20
HEADER = 4096                        # the header block; the results follow it
LIBRARY = 64 * MIB                   # the index; the results must end before it
FIRST_FILE = LIBRARY + MIB

# Shared by the agent and a kernel under test: the channel, the disk, and
# reading and writing what the disk holds.  Offsets are in bytes.
MACHINE = rf"""# mmlab's bare-metal machine (kexec.py): its channel and its disk
CHANNEL={CHANNEL}
DISK={DISK}
KEXEC={KEXEC}
say() {{ echo "$*" >> "$CHANNEL"; }}
disk_ready() {{
    for m in {" ".join(DISK_MODULES)}; do
        [ -e /lib/modules/mmlab/$m.ko ] && insmod /lib/modules/mmlab/$m.ko 2>/dev/null
    done
    for i in $(seq 100); do [ -e "$DISK" ] && return 0; sleep 0.1; done
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
# trial at a time.  The channel is opened before READY is said, so no byte
# of the request arrives while nobody reads the port.
AGENT = r"""# mmlab's bare-metal agent (kexec.py)
. /mmlab/machine.sh
say "MMLAB-AGENT-UP $(uname -r)"
disk_ready || { say "MMLAB-AGENT-ERROR no disk $DISK"; exit 1; }
send_results
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
# With no way back it reboots: a real machine's boot loader then starts its
# base kernel, whose agent reports the trial lost.
HOOKS = r"""# a kernel kexec'd by mmlab's bare-metal agent (kexec.py)
. /mmlab/machine.sh
nonce=$(sed -n 's/.*mmlab\.trial=\([^ ]*\).*/\1/p' /proc/cmdline)
say "MMLAB-UP $nonce $(uname -r)"
disk_ready || say "MMLAB-ERROR $nonce no disk $DISK under $(uname -r)"
deliver() { put_results "$nonce" /tmp/results; say "MMLAB-RAN $nonce"; }
finish() {
    why="no base kernel on the disk"
    if fetch base.vmlinuz /tmp/vmlinuz && fetch base.initrd /tmp/initrd \
            && fetch base.append /tmp/append; then
        if why=$($KEXEC -l /tmp/vmlinuz --initrd=/tmp/initrd --append="$(cat /tmp/append)" \
                 2>&1); then
            rm -f /tmp/vmlinuz /tmp/initrd
            say "MMLAB-KEXEC back"
            sync
            $KEXEC -e
            why="kexec -e returned"
        fi
    fi
    say "MMLAB-ERROR $nonce no way back by kexec ($(echo $why)); rebooting"
    sync
    reboot -f
}
"""


def tools_archive(cache: Path) -> Path:
    """kexec with the shared libraries it loads (packed at their host paths,
    as an exec workload's program is) and the machine's shell functions."""
    if not KEXEC.exists():
        raise MmlabError(f"{KEXEC}: not installed (make setup installs kexec-tools)")
    files = {str(p).lstrip("/"): (0o100755, p.read_bytes())
             for p in (KEXEC, *shared_libraries(KEXEC))}
    files["mmlab/machine.sh"] = (0o100644, MACHINE.encode())
    return initramfs.archive(files, cache)


def agent_initrd(base: images.Kernel, cache: Path, dest: Path) -> Path:
    """The base kernel's initramfs: mmlab's /init running the agent."""
    return initramfs.trial_initrd(initramfs.base_archive(cache), AGENT, dest,
                                  [initramfs.modules_archive(base), tools_archive(cache)])


def kernel_initrd(kernel: images.Kernel, cache: Path, dest: Path) -> Path:
    """A kernel under test's initramfs but its /trial.sh, which the agent
    appends (each part padded, so the trial's archive follows as is)."""
    hooks = initramfs.archive({"mmlab/kexec.sh": (0o100644, HOOKS.encode())}, cache)
    return initramfs.trial_initrd(initramfs.base_archive(cache), None, dest,
                                  [initramfs.modules_archive(kernel), tools_archive(cache),
                                   hooks])


def disk(dest: Path, files: dict[str, Path | bytes]) -> Path:
    """The machine's disk: an empty header and results area, then the
    library's index and `files` (name -> a file or bytes), sparse."""
    index, at = [], FIRST_FILE
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
