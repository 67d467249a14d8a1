"""A guest kernel's symbols as mmlab's QEMU plugin needs them: read once
from the kernel (`kernel_symbols`), and its stays file (`plugin_args`):
where its kernel entries are and which functions name a syscall, as
offsets from `_text` (attribution/functions.py reads the symbols).

The plugin (qemu-plugin/insns.c, `stays=PATH`) names each stay by the entry
its first block is in: the 64-bit syscall entry (`entry_SYSCALL_64`, also
the anchor from which it finds this boot's `_text` under KASLR), the compat
syscall entries, `asm_exc_page_fault` (a fault), the other `asm_exc_*`
(exceptions) and the interrupt entries; a syscall's stay then takes the
name of the first `__x64_sys_NAME` function it starts (`__se_sys_NAME` or
`__do_sys_NAME` on a kernel without those wrappers).  The file is kept in
the plugin's cache, by the hash of what it holds.
"""

from __future__ import annotations

import base64
import bisect
import functools
import gzip
from pathlib import Path

from mmlab.attribution import functions
from mmlab.attribution.functions import SymbolTable
from mmlab.errors import MmlabError
from mmlab.kernels import qemu_plugin
from mmlab.targets.boot import Guest, run_script
from mmlab.workloads import Workload, insns, syscalls
from mmlab.workloads.samples import Sample

ANCHOR = "entry_SYSCALL_64"
COMPAT = ("entry_SYSCALL_compat", "entry_SYSENTER_compat", "entry_INT80_compat",
          "asm_int80_emulation")
INTERRUPTS = ("asm_common_interrupt", "asm_spurious_interrupt", "irq_entries_start",
              "spurious_entries_start")
SYSCALL_PREFIXES = (("__x64_sys_",), ("__se_sys_", "__do_sys_"))   # in order of preference


def entry_label(name: str) -> tuple[str, str] | None:
    """(type, label) of a symbol where a stay begins, or None."""
    if name == ANCHOR:
        return "A", "syscall_unnamed"
    if name in COMPAT:
        return "S", "syscall_unnamed"
    if name == "asm_exc_page_fault":
        return "E", "fault"
    if name.startswith("asm_exc_"):
        return "E", "exception_" + name.removeprefix("asm_exc_")
    if name.startswith("asm_sysvec_") or name in INTERRUPTS:
        return "E", "interrupt"
    return None


def lines(table: SymbolTable) -> list[str]:
    """The stays file's lines (insns.c's read_stays): each entry with its
    size (to the next symbol: interrupt stubs start inside theirs), each
    syscall's function by its start."""
    out = []
    for offset, name in zip(table.offsets, table.names, strict=True):
        if found := entry_label(name):
            nxt = bisect.bisect_right(table.offsets, offset)
            end = table.offsets[nxt] if nxt < len(table.offsets) else table.end
            out.append(f"{found[0]} {offset:x} {max(end - offset, 1):x} {found[1]}")
    if not any(line.startswith("A ") for line in out):
        raise MmlabError(f"the kernel's symbols have no {ANCHOR}: its syscalls cannot be "
                         "told apart")
    for prefixes in SYSCALL_PREFIXES:
        named = [f"N {offset:x} syscall_{name.removeprefix(p)}"
                 for offset, name in zip(table.offsets, table.names, strict=True)
                 for p in prefixes if name.startswith(p)]
        if named:
            return out + named
    raise MmlabError("the kernel's symbols name no syscall functions (__x64_sys_*)")


def kernel_symbols(guest: Guest, cache: Path) -> Path:
    """The kernel's text symbols: kept with the kernel (a build's System.map),
    or read from its /proc/kallsyms in one boot (about 1 MB over the serial
    port, 5-10 s) and kept from then on."""
    if not guest.kernel.symbols.exists():
        dumped = run_script(guest, functions.DUMP_SCRIPT, cache=cache)
        try:
            guest.kernel.keep_symbols(gzip.decompress(base64.b64decode(dumped)))
        except (ValueError, OSError, EOFError) as exc:
            raise MmlabError(f"{guest.kernel.name}: /proc/kallsyms arrived unreadable: "
                             f"{exc}") from exc
    return guest.kernel.symbols


def counting_args(guest: Guest, cache: Path, metrics: list[str]) -> tuple[str, ...]:
    """A counting pass's stays=, and calls= where a metric names a function
    on a path (each path's functions inclusively: functions.inclusive_metrics).
    Following calls took a counting boot of the mprotect probe 1.6 to 4.2
    times as long (docs/instructions.md), so a profile asks for it."""
    calls = any(f"_{functions.INCLUSIVE}_" in m for m in metrics)
    return (*plugin_args(guest, cache),
            *(functions.calls_args(kernel_symbols(guest, cache)) if calls else ()))


def from_plugin(guest: Guest, cache: Path, workload: Workload, counted: list[Sample],
                output: str) -> None:
    """The counted samples' per-stay metrics, and each path's inclusive ones
    where the plugin followed calls."""
    syscalls.from_plugin(workload, counted, output)
    if insns.plugin_records(output, "calls"):
        functions.inclusive_metrics(workload, counted, output, kernel_symbols(guest, cache))


def plugin_args(guest: Guest, cache: Path) -> tuple[str, ...]:
    """The plugin's stays= argument for the guest's kernel."""
    return (qemu_plugin.file_arg("stays", stays_text(kernel_symbols(guest, cache))),)


@functools.cache
def stays_text(symbols: Path) -> str:
    """The stays file's text for a kernel's symbols, made once per run: every
    counting trial of a profile asks for it, and reading the symbols (about
    100,000 of them, gzipped) is the costly part."""
    return "\n".join(lines(SymbolTable.load(symbols))) + "\n"
