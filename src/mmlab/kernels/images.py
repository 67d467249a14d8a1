"""The kernel cache: Kernel (vmlinuz, config, modules, symbols and
kernel.json), fetched from the Debian catalog (apt-get download, nothing
installed), registered from a local bzImage, or stored by a source build.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.kernels.catalog import Apt, mirrors
from mmlab.kernels.modules import builtin, found, guest_modules, normal
from mmlab.kernels.specs import is_range, resolve
from mmlab.machine import paths, proc
from mmlab.names import safe_name

# The config options that decide what the workloads and attribution can do.
FEATURES = {
    "THP": "CONFIG_TRANSPARENT_HUGEPAGE", "KSM": "CONFIG_KSM", "SWAP": "CONFIG_SWAP",
    "ZRAM": "CONFIG_ZRAM", "NUMA": "CONFIG_NUMA", "COMPACTION": "CONFIG_COMPACTION",
    "MIGRATION": "CONFIG_MIGRATION", "KPROBES": "CONFIG_KPROBE_EVENTS",
    "FTRACE": "CONFIG_FUNCTION_TRACER", "FUNCTION_GRAPH": "CONFIG_FUNCTION_GRAPH_TRACER",
    "ADVISE_SYSCALLS": "CONFIG_ADVISE_SYSCALLS", "VIRTIO_BLK": "CONFIG_VIRTIO_BLK",
}


# A config's line that sets an option, or says it is not set.
SETTING = re.compile(r"^(?:(CONFIG_\w+)=(.*)|# (CONFIG_\w+) is not set)$")


def settings(text: str) -> dict[str, str]:
    """A config's options and values, "n" for those it says are not set:
    the one reading of a config, a kernel's as a build's (kconfig.py)."""
    out = {}
    for line in text.splitlines():
        m = SETTING.match(line.strip())
        if m:
            out[m.group(1) or m.group(3)] = m.group(2) if m.group(1) else "n"
    return out


FORMAT = 2   # kernel.json written by this mmlab: modules stored, catalog fields set



@dataclass(frozen=True)
class Kernel:
    name: str          # what profiles call it: "debian:6.12", "local:NAME", "build:NAME"
    version: str       # the kernel release, e.g. 6.12.117+deb13-cloud-amd64
    source: str        # the package and its version (and suite), or the local path
    config_sha256: str
    dir: str
    details: dict = field(default_factory=dict)   # builds: key, patches and their hashes
    package_version: str = ""   # Debian: the exact package version, e.g. 6.12.117-1
    suite: str = ""             # Debian: the suite it came from, e.g. trixie-backports
    flavour: str = ""           # Debian: cloud or generic
    packaging: str = ""         # unsigned, signed or split (Debian), build, local
    modules: list = field(default_factory=list)   # modules/NAME.ko in load order
    format: int = 1

    @property
    def image(self) -> Path:
        return Path(self.dir) / "vmlinuz"

    @property
    def config(self) -> Path:
        return Path(self.dir) / "config"

    @property
    def symbols(self) -> Path:
        """The kernel's symbols, System.map format, gzipped (may not exist yet)."""
        return Path(self.dir) / "symbols.gz"

    def keep_symbols(self, text: bytes) -> None:
        """Store a System.map (or a kallsyms read from this kernel) as its symbols."""
        tmp = self.symbols.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(gzip.compress(text))
        tmp.rename(self.symbols)

    def features(self) -> dict[str, str]:
        """FEATURE -> y, m or n, read from the config."""
        config = settings(self.config.read_text())
        return {feat: config.get(opt, "n") for feat, opt in FEATURES.items()}

    def option(self, name: str) -> str:
        """A config option's value ("y", "m", '"lz4"', ...), or "n"."""
        return settings(self.config.read_text()).get(name, "n")

    def identity(self) -> str:
        """What it is, in one line: release, package version, suite, flavour."""
        extra = ", ".join(x for x in (self.package_version, self.suite, self.flavour,
                                      self.packaging) if x)
        return f"{self.version} ({extra})" if extra else self.version

    def summary(self) -> dict:
        """`mmlab kernels list --json`: what it is, where from, and its features."""
        return {**asdict(self), "features": self.features()}



def cache_dir() -> Path:
    """The kernel cache ($MMLAB_KERNEL_CACHE, checked where paths reads it)."""
    return paths.kernel_cache()



def store(name: str, version: str, source: str, image: Path, config: Path,
          cache: Path | None = None, details: dict | None = None,
          modules: dict[str, bytes] | None = None, **catalog: str) -> Kernel:
    """Copy an image, its config and the modules (name -> .ko bytes, in load
    order) into the cache under `name`."""
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache / safe_name(name)
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix=".new-"))
    shutil.copyfile(image, tmp / "vmlinuz")
    shutil.copyfile(config, tmp / "config")
    if modules:
        (tmp / "modules").mkdir()
        for mod, data in modules.items():
            (tmp / "modules" / f"{mod}.ko").write_bytes(data)
    k = Kernel(name=name, version=version, source=source,
               config_sha256=hashlib.sha256(config.read_bytes()).hexdigest(), dir=str(dest),
               details=details or {}, modules=list(modules or {}), format=FORMAT, **catalog)
    (tmp / "kernel.json").write_text(json.dumps(asdict(k), indent=1))
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return k



def _download(apt: Apt, packages: tuple[str, ...], version: str, where: Path,
              spec: str) -> list[str]:
    """Download and unpack `packages` at `version`; returns those fetched from
    the pool because the Packages index does not list them."""
    listed: list[str] = []
    unlisted: list[str] = []
    for p in packages:
        have = apt.call("apt-cache", "madison", p, what=f"apt-cache madison {p}")
        (listed if any(line.split("|")[1].strip() == version
                       for line in have.splitlines()
                       if line.count("|") == 2 and line.rstrip().endswith(" Packages"))
         else unlisted).append(p)
    if listed:
        apt.call("apt-get", "download", *(f"{p}={version}" for p in listed), cwd=where,
                 what=f"debian:{spec}: apt-get download {' '.join(listed)}")
    for p in unlisted:
        _from_pool(apt, p, version, where, spec)
    for deb in where.glob("*.deb"):
        proc.call(["dpkg-deb", "-x", str(deb), str(where / "x")], what=f"dpkg-deb -x {deb.name}")
    return unlisted



def _from_pool(apt: Apt, package: str, version: str, where: Path, spec: str) -> None:
    """A package the image depends on (name and version from its Depends) that
    the Packages index does not list: fetched from the directory the Sources
    index gives for the source package that builds it."""
    text = apt.call("apt-cache", "showsrc", package, what=f"apt-cache showsrc {package}")
    directory = None
    for stanza in re.split(r"\n\s*\n", text):
        if re.search(rf"^Version: {re.escape(version)}$", stanza, re.M):
            m = re.search(r"^Directory: (\S+)$", stanza, re.M)
            directory = m.group(1) if m else None
    if not directory:
        raise MmlabError(f"debian:{spec}: {package} {version} is neither in the Packages nor "
                         "the Sources index, so its config and modules cannot be fetched")
    name = f"{package}_{version.split(':')[-1]}_amd64.deb"
    url = f"{mirrors()[0]}/{directory}/{name}"
    proc.call(["/usr/lib/apt/apt-helper", *apt.options(), "download-file", url, str(where / name)],
              timeout=1800, what=f"debian:{spec}: apt-helper download-file {name}")



def _find(x: Path, patterns: tuple[str, ...]) -> Path | None:
    for pattern in patterns:
        found = sorted(x.glob(pattern))
        if found:
            return found[0]
    return None



def add_debian(spec: str, cache: Path | None = None, apt: Apt | None = None) -> Kernel:
    """Fetch `debian:SPEC` from the catalog into the cache (nothing installed)."""
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    apt = apt or Apt()
    e = resolve(spec, apt)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as tmp:
        where = Path(tmp)
        unlisted = _download(apt, e.packages, e.package_version, where, spec)
        x = where / "x"
        image = _find(x, ("boot/vmlinuz-*", "usr/lib/modules/*/vmlinuz", "lib/modules/*/vmlinuz"))
        if image is None:
            raise MmlabError(f"debian:{spec}: no vmlinuz in {', '.join(e.packages)}")
        release = (image.name.removeprefix("vmlinuz-") if image.name != "vmlinuz"
                   else image.parent.name)
        config = _find(x, (f"boot/config-{release}", f"usr/lib/modules/{release}/config",
                           f"lib/modules/{release}/config"))
        if config is None:
            raise MmlabError(f"debian:{spec}: no config for {release} in {', '.join(e.packages)}")
        tree = _find(x, (f"usr/lib/modules/{release}", f"lib/modules/{release}"))
        modules = guest_modules(tree) if tree else {}
        return store(f"debian:{spec}", release,
                     f"{e.packages[0]} {e.package_version} ({e.suite})", image, config, cache,
                     modules=modules, package_version=e.package_version, suite=e.suite,
                     flavour=e.flavour, packaging=e.packaging,
                     details={"packages": list(e.packages), "from_pool": unlisted} if unlisted
                     else {"packages": list(e.packages)})



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
    return store(f"local:{name or safe_name(image.parent.parent.parent.name or image.name)}",
                  release, str(image.resolve()), image, config, cache, packaging="local")



def _bzimage_release(image: Path) -> str | None:
    """The release string the x86 boot header points to (kernel_version field)."""
    data = image.read_bytes()
    off = int.from_bytes(data[0x20E:0x210], "little")
    if not off:
        return None
    text = data[off + 0x200: off + 0x300].split(b"\0", 1)[0].decode(errors="replace")
    return text.split()[0] if text else None



def cached(cache: Path | None = None) -> list[Kernel]:
    """The cached kernels.  An entry this mmlab cannot read (written by another
    version, or half-written) is skipped: it is fetched or built again."""
    cache = cache or cache_dir()
    out = []
    for meta in sorted(cache.glob("*/kernel.json")):
        try:
            out.append(Kernel(**json.loads(meta.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return out



def get(name: str, cache: Path | None = None) -> Kernel:
    """A cached kernel by name; an unknown one is an error that says how to add it."""
    if is_range(name):
        raise MmlabError(f"{name} is a release range: ranges are for a profile's kernel axis "
                         "and narrow --kernels")
    for k in cached(cache):
        if k.name == name:
            return k
    known = ", ".join(k.name for k in cached(cache)) or "none cached"
    how = (f"build it with 'mmlab kernels build SOURCE --name {name.removeprefix('build:')}'"
           if name.startswith("build:") else
           f"add it with 'mmlab kernels add {name if name.startswith('debian:') else 'PATH'}'")
    raise MmlabError(f"unknown kernel '{name}' ({known}); {how}")



def fetchable(name: str) -> None:
    """Refuse a local or build kernel the cache lacks, before anything is
    stored: nothing can fetch one, so each of its trials would fail."""
    if not name.startswith("debian:"):
        get(name)


def ensure(name: str, cache: Path | None = None) -> Kernel:
    """A kernel ready to boot: cached, or fetched now if it is a Debian one.
    A Debian kernel cached by an older mmlab (no modules, no package
    version) is fetched again."""
    try:
        k = get(name, cache)
    except MmlabError:
        if not name.startswith("debian:"):
            raise
        return _fetched(name, cache)
    if name.startswith("debian:") and k.format < FORMAT:
        return _fetched(name, cache)
    return k


def ready(name: str, say: Callable[[str], None]) -> Kernel | MmlabError:
    """`ensure`, saying so before a fetch, with the error returned rather
    than raised: a target keeps it and fails each trial of that kernel with it."""
    try:
        k = get(name)
        if not name.startswith("debian:") or k.format >= FORMAT:
            return k
    except MmlabError as missing:
        if not name.startswith("debian:"):
            return missing
    say(f"fetching kernel {name} (apt-get download)")
    try:
        return ensure(name)
    except MmlabError as exc:
        return exc


def _fetched(name: str, cache: Path | None) -> Kernel:
    """A Debian kernel fetched by this process, or by another that was
    fetching it at the same time (found made once its lock is free)."""
    with paths.filling((cache or cache_dir()) / safe_name(name)):
        try:
            k = get(name, cache)
            if k.format >= FORMAT:
                return k
        except MmlabError:
            pass
        return add_debian(name.removeprefix("debian:"), cache)


def machine_modules(kernel: Kernel, names: tuple[str, ...],
                    say: Callable[[str], None]) -> dict[str, bytes]:
    """The modules a bare-metal machine loads under `kernel` (`names`, its
    disk's driver mostly, and what they depend on), in load order.  The
    cache keeps a guest's modules only, so the first machine to ask has the
    kernel's packages fetched again; what they hold (or build in) is kept
    beside the kernel, so a later ask reads the cache.  A name the kernel
    neither builds nor builds in is refused: its machine could not find
    its disk.  A kernel mmlab did not fetch (local, build) is taken to
    build in what it lacks: its machine says so if it cannot find its disk."""
    where = Path(kernel.dir) / "modules"
    known = Path(kernel.dir) / "built-in.json"
    inside = set(json.loads(known.read_text())) if known.exists() else set()
    have = found(where, names)
    lacking = [n for n in map(normal, names) if n not in have and n not in inside]
    if not lacking or not kernel.name.startswith("debian:"):
        return have
    say(f"fetching {kernel.name}'s packages again for {', '.join(lacking)}")
    with tempfile.TemporaryDirectory(dir=kernel.dir, prefix=".modules-") as tmp:
        _download(Apt(), tuple(kernel.details.get("packages", ())), kernel.package_version,
                  Path(tmp), kernel.name.removeprefix("debian:"))
        tree = _find(Path(tmp) / "x", (f"usr/lib/modules/{kernel.version}",
                                       f"lib/modules/{kernel.version}"))
        got = found(tree, names) if tree else {}
        inside |= builtin(tree) if tree else set()
    missing = [n for n in lacking if n not in got and n not in inside]
    if missing:
        raise MmlabError(f"{kernel.name} ({kernel.version}) has no module {', '.join(missing)} "
                         "and does not build it in")
    where.mkdir(exist_ok=True)
    for name, data in got.items():
        (where / f"{name}.ko").write_bytes(data)
    known.write_text(json.dumps(sorted(inside)))
    return found(where, names)
