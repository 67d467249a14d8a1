"""Kernel images for guests: Debian packages fetched with apt, or local builds.

`debian:6.12` resolves to the newest `linux-image-6.12.*-cloud-amd64-unsigned`
that apt knows (cloud flavour: virtio and serial built in, small), fetched
with `apt-get download` (nothing is installed on the host) and unpacked into
the cache; `debian:6.12.115` picks that exact upstream version.  A local
bzImage is registered with its .config.  Each cached kernel keeps the
vmlinuz, the config, and a `kernel.json` with its version, source and
config hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import MmlabError

# The config options that decide what the workloads and attribution can do.
FEATURES = {
    "THP": "CONFIG_TRANSPARENT_HUGEPAGE", "KSM": "CONFIG_KSM", "SWAP": "CONFIG_SWAP",
    "ZRAM": "CONFIG_ZRAM", "NUMA": "CONFIG_NUMA", "COMPACTION": "CONFIG_COMPACTION",
    "MIGRATION": "CONFIG_MIGRATION", "KPROBES": "CONFIG_KPROBE_EVENTS",
    "FTRACE": "CONFIG_FUNCTION_TRACER", "FUNCTION_GRAPH": "CONFIG_FUNCTION_GRAPH_TRACER",
    "ADVISE_SYSCALLS": "CONFIG_ADVISE_SYSCALLS",
}


@dataclass(frozen=True)
class Kernel:
    name: str          # what profiles call it: "debian:6.12", "local:NAME"
    version: str       # the kernel release, e.g. 6.12.117+deb12-cloud-amd64
    source: str        # the package and its version, or the local path
    config_sha256: str
    dir: str
    details: dict = field(default_factory=dict)   # builds: key, patches and their hashes

    @property
    def image(self) -> Path:
        return Path(self.dir) / "vmlinuz"

    @property
    def config(self) -> Path:
        return Path(self.dir) / "config"

    def features(self) -> dict[str, str]:
        """FEATURE -> y, m or n, read from the config."""
        text = self.config.read_text()
        out = {}
        for feat, opt in FEATURES.items():
            m = re.search(rf"^{opt}=(\w+)$", text, re.M)
            out[feat] = m.group(1) if m else "n"
        return out


def cache_dir() -> Path:
    env = os.environ.get("MMLAB_KERNEL_CACHE")
    return Path(env) if env else Path.home() / ".cache/mmlab/kernels"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]", "_", name)


def store(name: str, version: str, source: str, image: Path, config: Path,
          cache: Path | None = None, details: dict | None = None) -> Kernel:
    """Copy an image and its config into the cache under `name`."""
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache / _slug(name)
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".new-"))
    shutil.copyfile(image, tmp / "vmlinuz")
    shutil.copyfile(config, tmp / "config")
    k = Kernel(name=name, version=version, source=source,
               config_sha256=hashlib.sha256(config.read_bytes()).hexdigest(), dir=str(dest),
               details=details or {})
    (tmp / "kernel.json").write_text(json.dumps(asdict(k), indent=1))
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return k


def _apt(*args: str) -> str:
    proc = subprocess.run(["apt-cache", *args], capture_output=True, text=True)
    return proc.stdout


def _vkey(version: str) -> list:
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", version)]


def resolve_debian(spec: str) -> tuple[str, str]:
    """'6.12' or '6.12.115' -> (package, version) of the newest match apt knows."""
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", spec)
    if not m:
        raise MmlabError(f"debian:{spec}: expected debian:MAJOR.MINOR or debian:MAJOR.MINOR.PATCH")
    series = f"{m.group(1)}.{m.group(2)}"

    def search() -> list[str]:
        return re.findall(rf"^(linux-image-{re.escape(series)}\.\S*-cloud-amd64-unsigned) ",
                          _apt("search", f"^linux-image-{series}"), re.M)
    names = search()
    if not names and not _apt("search", "^linux-image-").strip() and os.geteuid() == 0:
        # A fresh machine has empty package lists; read them once.
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
        names = search()
    candidates = []
    for pkg in names:
        ver = re.search(r"^Version: (\S+)", _apt("show", "--no-all-versions", pkg), re.M)
        if ver and (not m.group(3) or ver.group(1).startswith(f"{spec}-")
                    or ver.group(1).startswith(f"{spec}+")):
            candidates.append((pkg, ver.group(1)))
    if not candidates:
        hint = "" if names else " (run 'apt-get update' if the package lists are empty)"
        raise MmlabError(f"debian:{spec}: no Debian cloud kernel package matches{hint}")
    return max(candidates, key=lambda c: _vkey(c[1]))


def add_debian(spec: str, cache: Path | None = None) -> Kernel:
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    pkg, version = resolve_debian(spec)
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(["apt-get", "download", f"{pkg}={version}"], cwd=tmp,
                              capture_output=True, text=True)
        debs = list(Path(tmp).glob("*.deb"))
        if proc.returncode or not debs:
            raise MmlabError(f"debian:{spec}: apt-get download {pkg} failed: "
                             f"{proc.stderr.strip().splitlines()[-1:] or proc.returncode}")
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), f"{tmp}/x"], check=True)
        images = list(Path(tmp, "x/boot").glob("vmlinuz-*"))
        if not images:
            raise MmlabError(f"{pkg}: no vmlinuz in the package")
        release = images[0].name.removeprefix("vmlinuz-")
        return store(f"debian:{spec}", release, f"{pkg} {version}", images[0],
                      Path(tmp, "x/boot", f"config-{release}"), cache)


def add_local(image: Path, config: Path, name: str | None = None,
              cache: Path | None = None) -> Kernel:
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    for path, what in ((image, "kernel image"), (config, "--config")):
        if not path.is_file():
            raise MmlabError(f"{path}: no such {what}")
    head = image.read_bytes()[:0x300]
    if head[0x202:0x206] != b"HdrS":
        raise MmlabError(f"{image}: not a bzImage (no 'HdrS' boot header)")
    release = _bzimage_release(image) or "unknown"
    return store(f"local:{name or _slug(image.parent.parent.parent.name or image.name)}",
                  release, str(image.resolve()), image, config, cache)


def _bzimage_release(image: Path) -> str | None:
    """The release string the x86 boot header points to (kernel_version field)."""
    data = image.read_bytes()
    off = int.from_bytes(data[0x20E:0x210], "little")
    if not off:
        return None
    text = data[off + 0x200: off + 0x300].split(b"\0", 1)[0].decode(errors="replace")
    return text.split()[0] if text else None


def cached(cache: Path | None = None) -> list[Kernel]:
    cache = cache or cache_dir()
    out = []
    for meta in sorted(cache.glob("*/kernel.json")):
        out.append(Kernel(**json.loads(meta.read_text())))
    return out


def get(name: str, cache: Path | None = None) -> Kernel:
    """A cached kernel by name; an unknown one is an error that says how to add it."""
    for k in cached(cache):
        if k.name == name:
            return k
    known = ", ".join(k.name for k in cached(cache)) or "none cached"
    raise MmlabError(f"unknown kernel '{name}' ({known}); add it with "
                     f"'mmlab kernels add {name if name.startswith('debian:') else 'PATH'}'")
