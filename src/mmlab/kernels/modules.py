"""Kernel modules taken from a kernel package's tree, decompressed, in load
order: those a guest loads for swap (zram and its compressors, virtio_blk),
kept with every cached kernel, and those a bare-metal machine loads (its
disk's driver), found when its library is staged.
"""

from __future__ import annotations

import gzip
import lzma
import re
from pathlib import Path

from mmlab.errors import MmlabError

# Modules a guest loads for swap: zram with its allocator and compressors,
# virtio_pci and virtio_blk for a swap disk.  Those built in are not found.
GUEST_MODULES = ("zsmalloc", "zram", "lzo", "lzo-rle", "lzo_compress", "lzo_decompress",
                 "lz4", "lz4_compress", "lz4_decompress", "lz4hc", "lz4hc_compress",
                 "zstd", "zstd_compress", "zstd_decompress", "virtio_pci", "virtio_blk")


def _modinfo(ko: bytes, key: str) -> list[str]:
    return [v.decode() for v in re.findall(rb"(?:^|\0)" + key.encode() + rb"=([^\0]*)", ko)]



def guest_modules(tree: Path) -> dict[str, bytes]:
    """The swap modules found under `tree` (…/lib/modules/RELEASE), with their
    dependencies, decompressed, dependencies first."""
    return found(tree, GUEST_MODULES)


def builtin(tree: Path) -> set[str]:
    """The modules the kernel of `tree` builds in (its modules.builtin)."""
    listed = tree / "modules.builtin"
    names = listed.read_text().split() if listed.exists() else []
    return {normal(Path(n).name.removesuffix(".ko")) for n in names}


def normal(name: str) -> str:
    return name.replace("-", "_")


def found(tree: Path, names: tuple[str, ...]) -> dict[str, bytes]:
    """Those of `names` found under `tree` (a package's module tree, or a
    cached kernel's flat folder of them), with their dependencies,
    decompressed, dependencies first; a name not found is left out."""
    index: dict[str, Path] = {}
    for ko in tree.rglob("*.ko*"):
        index[normal(re.sub(r"\.ko(\.xz|\.zst|\.gz)?$", "", ko.name))] = ko
    loaded: dict[str, bytes] = {}

    def read(path: Path) -> bytes:
        data = path.read_bytes()
        if path.suffix == ".xz":
            return lzma.decompress(data)
        if path.suffix == ".gz":
            return gzip.decompress(data)
        if path.suffix == ".zst":
            raise MmlabError(f"{path.name}: zstd-compressed modules are not supported")
        return data

    def add(name: str, chain: tuple[str, ...] = ()) -> None:
        name = normal(name)
        if name in loaded or name not in index or name in chain:
            return
        data = read(index[name])
        for dep in ",".join(_modinfo(data, "depends")).split(","):
            if dep:
                add(dep, chain + (name,))
        loaded[name] = data
    for name in names:
        add(name)
    return loaded
