"""Kernel images for guests: Debian's kernel catalog fetched with apt, or local builds.

mmlab keeps an apt configuration of its own in its cache (`~/.cache/mmlab/apt`):
a sources list naming every Debian suite the host's Debian mirror serves
(bookworm, trixie, their -updates, -security and -backports, sid), its own
package lists, state and archives.  The host's sources are never touched;
the mirror is the one the host's apt uses (or `$MMLAB_APT_MIRROR`, which is
also how a test points it at a closed port).  The lists are read on demand
and again when older than a day (`$MMLAB_APT_MAX_AGE_S`).

`debian:6.12` is the newest 6.12 cloud kernel of any suite; `debian:6.12.115`
picks that upstream version; `-generic` picks the generic flavour.  Two
packagings exist:

* up to 6.18, `linux-image-ABI-cloud-amd64[-unsigned]` holds the vmlinuz,
  its config (`/boot/config-RELEASE`) and the modules;
* from 6.19 on, `linux-image-ABI-cloud-amd64` is a meta package; the
  vmlinuz is in `linux-binary-ABI-...` (`/usr/lib/modules/RELEASE/vmlinuz`),
  the config in `linux-base-ABI-...` (`/usr/lib/modules/RELEASE/config`) and
  the modules in `linux-modules-ABI-...`.

When a suite's Packages index does not list the linux-base or linux-modules
package an image depends on (6.19 to 7.1 here), it is fetched from the pool
directory the Sources index gives for its source package (hence `deb-src`
lines for the backports suites and sid), by the name and version the image's
Depends names.  Nothing is installed on the host: packages are fetched with
`apt-get download` (or `apt-helper download-file`) and unpacked.  Each
cached kernel keeps the vmlinuz, the config, the modules guests load for
swap (zram and its compressors, virtio_blk, decompressed, in load order)
and a `kernel.json` with its release, the exact package version, suite,
flavour and packaging.  Per-function instruction counts need the kernel's
text symbols (`symbols.gz`): a build's System.map, or for a Debian kernel
(whose package ships a placeholder System.map; the real one is in the -dbg
package) its own /proc/kallsyms, read from a guest once and kept.

`debian:6.12..debian:7.3` is a release range: one kernel per release series
the catalog has, from the first to the last.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mmlab.errors import MmlabError
from mmlab.machine import proc
from mmlab.names import safe_name

# The config options that decide what the workloads and attribution can do.
FEATURES = {
    "THP": "CONFIG_TRANSPARENT_HUGEPAGE", "KSM": "CONFIG_KSM", "SWAP": "CONFIG_SWAP",
    "ZRAM": "CONFIG_ZRAM", "NUMA": "CONFIG_NUMA", "COMPACTION": "CONFIG_COMPACTION",
    "MIGRATION": "CONFIG_MIGRATION", "KPROBES": "CONFIG_KPROBE_EVENTS",
    "FTRACE": "CONFIG_FUNCTION_TRACER", "FUNCTION_GRAPH": "CONFIG_FUNCTION_GRAPH_TRACER",
    "ADVISE_SYSCALLS": "CONFIG_ADVISE_SYSCALLS", "VIRTIO_BLK": "CONFIG_VIRTIO_BLK",
}
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
        text = self.config.read_text()
        out = {}
        for feat, opt in FEATURES.items():
            m = re.search(rf"^{opt}=(\w+)$", text, re.M)
            out[feat] = m.group(1) if m else "n"
        return out

    def option(self, name: str) -> str:
        """A config option's value ("y", "m", '"lz4"', ...), or "n"."""
        m = re.search(rf"^{name}=(.*)$", self.config.read_text(), re.M)
        return m.group(1) if m else "n"

    def identity(self) -> str:
        """What it is, in one line: release, package version, suite, flavour."""
        extra = ", ".join(x for x in (self.package_version, self.suite, self.flavour,
                                      self.packaging) if x)
        return f"{self.version} ({extra})" if extra else self.version

    def summary(self) -> dict:
        """`mmlab kernels list --json`: what it is, where from, and its features."""
        return {**asdict(self), "features": self.features()}


def cache_dir() -> Path:
    env = os.environ.get("MMLAB_KERNEL_CACHE")
    return Path(env) if env else Path.home() / ".cache/mmlab/kernels"


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


# ---------------------------------------------------------------- Debian versions

def _order(c: str) -> int:
    if c == "~":
        return -1
    if c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _cmp_part(a: str, b: str) -> int:
    """dpkg's comparison of an upstream version or revision."""
    i = j = 0
    while i < len(a) or j < len(b):
        diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            bc = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ac != bc:
                return -1 if ac < bc else 1
            i += 1
            j += 1
        ia, jb = i, j
        while i < len(a) and a[i].isdigit():
            i += 1
        while j < len(b) and b[j].isdigit():
            j += 1
        diff = int(a[ia:i] or 0) - int(b[jb:j] or 0)
        if diff:
            return -1 if diff < 0 else 1
    return 0


def compare_versions(a: str, b: str) -> int:
    """Debian package versions compared as dpkg does: -1, 0 or 1."""
    def split(v: str) -> tuple[int, str, str]:
        epoch, _, rest = v.rpartition(":") if ":" in v else ("0", "", v)
        up, _, rev = rest.rpartition("-") if "-" in rest else (rest, "", "0")
        return int(epoch or 0), up, rev
    ea, ua, ra = split(a)
    eb, ub, rb = split(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _cmp_part(ua, ub) or _cmp_part(ra, rb)


class _VKey:
    def __init__(self, v: str):
        self.v = v

    def __lt__(self, other: _VKey) -> bool:
        return compare_versions(self.v, other.v) < 0


def upstream(package_version: str) -> str:
    """6.12.117-1~deb12u1 -> 6.12.117; 7.3~rc7-1~exp1 -> 7.3~rc7."""
    return package_version.split(":")[-1].rsplit("-", 1)[0]


def series_of(upstream_version: str) -> str:
    m = re.match(r"(\d+)\.(\d+)", upstream_version)
    return f"{m.group(1)}.{m.group(2)}" if m else upstream_version


def _series_key(series: str) -> tuple[int, int]:
    major, minor = series.split(".")
    return int(major), int(minor)


# ---------------------------------------------------------------- mmlab's apt

CODENAMES = ("bookworm", "trixie")
SUITES = ("bookworm", "bookworm-updates", "bookworm-backports", "trixie", "trixie-updates",
          "trixie-backports", "sid")
SECURITY_SUITES = ("bookworm-security", "trixie-security")
# deb-src: where split kernel packages live (backports, sid), and bookworm,
# which carries the host's qemu source (the TCG plugin's header, qemu_plugin.py).
SOURCE_SUITES = ("bookworm", "bookworm-backports", "trixie-backports", "sid")
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
MAX_AGE_S = 24 * 3600


def _host_sources(etc: Path = Path("/etc/apt")) -> list[tuple[str, list[str]]]:
    """(URI, suites) of every 'deb' source the host's apt reads."""
    out: list[tuple[str, list[str]]] = []
    files = [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*.list"))]
    for f in files:
        if not f.is_file():
            continue
        for line in f.read_text(errors="replace").splitlines():
            line = re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).split()
            if len(line) >= 3 and line[0] == "deb":
                out.append((line[1], [line[2]]))
    for f in sorted((etc / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", f.read_text(errors="replace")):
            fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M))
            if "deb" in fields.get("Types", "").split() and \
                    fields.get("Enabled", "yes").lower() != "no":
                for uri in fields.get("URIs", "").split():
                    out.append((uri, fields.get("Suites", "").split()))
    return out


def mirrors(etc: Path = Path("/etc/apt")) -> tuple[str, str | None]:
    """(Debian archive URI, security archive URI or None): the ones the host's
    apt uses, or $MMLAB_APT_MIRROR (its security archive is URI-security)."""
    env = os.environ.get("MMLAB_APT_MIRROR")
    if env:
        return env.rstrip("/"), env.rstrip("/") + "-security"
    archive = security = None
    for uri, suites in _host_sources(etc):
        if any(s.endswith("-security") for s in suites):
            security = security or uri.rstrip("/")
        elif any(s.split("-")[0] in (*CODENAMES, "bullseye", "sid", "forky", "stable",
                                     "testing", "unstable") for s in suites):
            archive = archive or uri.rstrip("/")
    if not archive:
        raise MmlabError("no Debian archive in /etc/apt/sources.list*: set MMLAB_APT_MIRROR "
                         "to the Debian mirror's URI")
    return archive, security


class Apt:
    """mmlab's own apt: sources, lists, state and archives under `root`."""

    def __init__(self, root: Path | None = None):
        self.root = root or cache_dir().parent / "apt"

    def sources(self) -> str:
        archive, security = mirrors()
        signed = f" [signed-by={KEYRING}]" if KEYRING.exists() else ""
        lines = [f"deb{signed} {archive} {s} main" for s in SUITES]
        # The split packaging's config and modules are not always in a suite's
        # Packages index; the Sources index says where their source keeps them.
        lines += [f"deb-src{signed} {archive} {s} main" for s in SOURCE_SUITES]
        if security:
            lines += [f"deb{signed} {security} {s} main" for s in SECURITY_SUITES]
        return "\n".join(lines) + "\n"

    def options(self) -> list[str]:
        r = self.root
        opts = {
            "Dir::Etc::SourceList": r / "sources.list", "Dir::Etc::SourceParts": "/dev/null",
            "Dir::Etc::Preferences": "/dev/null", "Dir::Etc::PreferencesParts": "/dev/null",
            "Dir::State": r / "state", "Dir::State::Lists": r / "lists",
            "Dir::State::status": r / "status", "Dir::Cache": r / "cache",
            "Dir::Cache::archives": r / "archives",
            "Dir::Cache::pkgcache": r / "cache/pkgcache.bin",
            "Dir::Cache::srcpkgcache": r / "cache/srcpkgcache.bin",
            "APT::Architecture": "amd64", "APT::Architectures": "amd64",
            "APT::Sandbox::User": "root", "Acquire::Languages": "none",
            "Acquire::Retries": "0", "Acquire::http::Timeout": "30",
            "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled": "false",
            "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled": "false",
            "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled": "false",
            "Acquire::IndexTargets::deb::DEP-11-icons-hidpi::DefaultEnabled": "false",
            "Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled": "false",
        }
        return [a for k, v in opts.items() for a in ("-o", f"{k}={v}")]

    def _state(self) -> dict:
        try:
            return json.loads((self.root / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    def fresh(self) -> bool:
        st = self._state()
        return (st.get("sources") == self.sources()
                and time.time() - st.get("updated", 0) < float(
                    os.environ.get("MMLAB_APT_MAX_AGE_S", MAX_AGE_S))
                and (self.root / "catalog.json").exists())

    def refresh(self, force: bool = False) -> None:
        """Read the package lists of every suite the mirror serves (apt-get
        update with mmlab's config), unless they are fresh."""
        if not force and self.fresh():
            return
        text = self.sources()
        for d in ("lists/partial", "archives/partial", "cache", "state"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "status").touch()
        (self.root / "sources.list").write_text(text)
        out = proc.run(["apt-get", *self.options(), "update"], check=False, timeout=900,
                       what="apt-get update (mmlab's Debian catalog)")
        archive, security = mirrors()
        served = [s for uri, suites in ((archive, SUITES), (security, SECURITY_SUITES)) if uri
                  for s in suites if self._has_release(uri, s)]
        if not served:
            reasons = re.findall(r"^\s+(\S.*)$", out.stdout, re.M) or \
                out.stderr.strip().splitlines()[-1:] or ["no answer"]
            archive = mirrors()[0]
            raise MmlabError(f"the Debian registry at {archive} cannot be reached: "
                             f"{reasons[0].strip()}")
        catalog = self._read_catalog()
        (self.root / "catalog.json").write_text(json.dumps(catalog))
        (self.root / "state.json").write_text(json.dumps(
            {"sources": text, "updated": time.time(), "served": served}))

    def _has_release(self, uri: str, suite: str) -> bool:
        """apt names a list file after its URI: host_path_dists_SUITE_InRelease."""
        prefix = re.sub(r"^\w+://", "", uri).replace("/", "_")
        return any((self.root / "lists" / f"{prefix}_dists_{suite}_{n}").exists()
                   for n in ("InRelease", "Release"))

    def served(self) -> list[str]:
        return self._state().get("served", [])

    def run(self, tool: str, *args: str, cwd: Path | None = None, what: str = "") -> str:
        return proc.run([tool, *self.options(), *args], cwd=cwd, timeout=1800,
                        what=what or f"{tool} {args[0] if args else ''}").stdout

    def _read_catalog(self) -> list[dict]:
        names = [n for prefix in ("linux-image-", "linux-binary-", "linux-source-")
                 for n in self.run("apt-cache", "pkgnames", prefix).split()
                 if PACKAGE.match(n)]
        rows = []
        if names:
            for line in self.run("apt-cache", "madison", *sorted(set(names))).splitlines():
                parts = [p.strip() for p in line.split("|")]
                if len(parts) == 3:
                    m = re.search(r"\s(\S+?)/\S+\s+\S+\s+Packages", parts[2])
                    rows.append({"package": parts[0], "version": parts[1],
                                 "suite": m.group(1) if m else "?"})
        return rows

    def catalog(self) -> list[dict]:
        self.refresh()
        return json.loads((self.root / "catalog.json").read_text())


# linux-image-ABI-FLAVOUR[-unsigned], linux-binary-ABI-FLAVOUR, linux-source-X.Y
PACKAGE = re.compile(r"^linux-(?:(image|binary)-(\d+\.\d+(?:\.\d+)?(?:-\d+)?(?:\+deb\d+(?:\.\d+)?)?)"
                     r"-(cloud-amd64|amd64)(-unsigned)?|source-(\d+\.\d+))$")
FLAVOURS = {"cloud-amd64": "cloud", "amd64": "generic"}


@dataclass(frozen=True)
class Entry:
    """One fetchable kernel of the catalog."""
    series: str
    upstream: str
    package_version: str
    suite: str
    flavour: str
    packaging: str       # unsigned | signed | split
    packages: tuple[str, ...]   # what to download: the image (or binary, base, modules)


def entries(catalog: list[dict]) -> list[Entry]:
    """The catalog's kernels, one per (flavour, package version), best packaging first."""
    have = {(r["package"], r["version"]): r["suite"] for r in catalog}
    found: dict[tuple[str, str], Entry] = {}
    for r in catalog:
        m = PACKAGE.match(r["package"])
        if not m or not m.group(1):
            continue
        kind, abi, flav, unsigned = m.group(1), m.group(2), m.group(3), m.group(4)
        ver, flavour = r["version"], FLAVOURS[flav]
        if kind == "binary":
            base, mods = f"linux-base-{abi}-{flav}", f"linux-modules-{abi}-{flav}"
            entry = Entry(series_of(upstream(ver)), upstream(ver), ver, r["suite"], flavour,
                          "split", (r["package"], base, mods))
        elif (f"linux-binary-{abi}-{flav}", ver) in have:
            continue             # the meta package of the split packaging
        elif not re.match(r"\d+\.\d+\.\d+", abi):
            continue             # linux-image-6.12-cloud-amd64: the series' meta package
        else:
            entry = Entry(series_of(upstream(ver)), upstream(ver), ver, r["suite"], flavour,
                          "unsigned" if unsigned else "signed", (r["package"],))
        key = (flavour, ver)
        best = found.get(key)
        if best is None or (best.packaging == "signed" and entry.packaging != "signed"):
            found[key] = entry
    return sorted(found.values(), key=lambda e: (e.flavour, _VKey(e.package_version)))


SPEC = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:-(cloud|generic))?$")


def parse_spec(spec: str) -> tuple[str, str | None, str]:
    """'6.12' -> ('6.12', None, 'cloud'); '6.12.115-generic' -> ('6.12', '6.12.115', 'generic')."""
    m = SPEC.match(spec)
    if not m:
        raise MmlabError(f"debian:{spec}: expected debian:MAJOR.MINOR[.PATCH][-generic], "
                         "e.g. debian:6.12 or debian:7.3.4")
    series = f"{m.group(1)}.{m.group(2)}"
    return series, f"{series}.{m.group(3)}" if m.group(3) else None, m.group(4) or "cloud"


def resolve(spec: str, apt: Apt | None = None) -> Entry:
    """'6.12' or '6.12.115' (or ...-generic) -> the newest matching catalog entry."""
    series, exact, flavour = parse_spec(spec)
    apt = apt or Apt()
    all_entries = [e for e in entries(apt.catalog()) if e.flavour == flavour]
    mine = [e for e in all_entries if e.series == series
            and (exact is None or e.upstream == exact or e.upstream.startswith(exact + "+"))]
    if not mine:
        known = sorted({e.series for e in all_entries}, key=_series_key)
        if any(e.series == series for e in all_entries):
            have = ", ".join(sorted({e.upstream for e in all_entries if e.series == series},
                                    key=_VKey)[-6:])
            raise MmlabError(f"debian:{spec}: the Debian catalog has no {exact} {flavour} kernel "
                             f"(its {series} kernels: ... {have})")
        raise MmlabError(f"debian:{spec}: the Debian catalog has no {series} {flavour} kernel "
                         f"(release series it has: {', '.join(known) or 'none'})")
    # A release before a release candidate of the same series: dpkg order does it.
    return max(mine, key=lambda e: _VKey(e.package_version))


def catalog_rows(apt: Apt, series: str | None = None) -> list[Entry]:
    """`mmlab kernels available`: every version of `series`, or the newest of
    each release series and flavour, by flavour then series."""
    found = entries(apt.catalog())
    if series:
        rows = [e for e in found if e.series == series]
        if not rows:
            raise MmlabError(f"no {series} kernels in the Debian catalog (release series it "
                             f"has: {', '.join(series_available(apt))})")
        return rows
    newest: dict[tuple[str, str], Entry] = {}
    for e in found:            # sorted oldest first: the last one wins
        newest[(e.series, e.flavour)] = e
    return sorted(newest.values(), key=lambda e: (e.flavour, _series_key(e.series)))


def series_available(apt: Apt | None = None, flavour: str = "cloud") -> list[str]:
    return sorted({e.series for e in entries((apt or Apt()).catalog()) if e.flavour == flavour},
                  key=_series_key)


# ---------------------------------------------------------------- release ranges

RANGE = re.compile(r"^debian:([0-9.]+(?:-(?:cloud|generic))?)\.\.(?:debian:)?"
                   r"([0-9.]+(?:-(?:cloud|generic))?)$")


def is_range(name: str) -> bool:
    return isinstance(name, str) and ".." in name


def expand(names: list, apt: Apt | None = None) -> list:
    """Each release range (debian:6.12..debian:7.3) -> one kernel per release
    series the catalog has from the first to the last, both ends as given;
    other names stay as they are."""
    out: list = []
    for name in names:
        if not is_range(name):
            out.append(name)
            continue
        m = RANGE.match(name)
        if not m:
            raise MmlabError(f"{name}: a release range is debian:X.Y..debian:X.Y "
                             "(e.g. debian:6.12..debian:7.3)")
        (s0, _, f0), (s1, _, f1) = parse_spec(m.group(1)), parse_spec(m.group(2))
        if f0 != f1:
            raise MmlabError(f"{name}: both ends of a release range need the same flavour")
        if _series_key(s0) >= _series_key(s1):
            raise MmlabError(f"{name}: a release range goes from older to newer")
        have = series_available(apt, f0)
        for end in (s0, s1):
            if end not in have:
                raise MmlabError(f"{name}: {end} is not a release series the Debian catalog "
                                 f"has (it has {', '.join(have)})")
        suffix = "" if f0 == "cloud" else f"-{f0}"
        middle = [f"debian:{s}{suffix}" for s in have
                  if _series_key(s0) < _series_key(s) < _series_key(s1)]
        out += [f"debian:{m.group(1)}", *middle, f"debian:{m.group(2)}"]
    if len(set(map(str, out))) != len(out):
        raise MmlabError(f"{', '.join(map(str, names))}: the expanded kernels repeat one")
    return out


# ---------------------------------------------------------------- fetching

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
    index: dict[str, Path] = {}
    for ko in tree.rglob("*.ko*"):
        index[re.sub(r"\.ko(\.xz|\.zst|\.gz)?$", "", ko.name).replace("-", "_")] = ko
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
        name = name.replace("-", "_")
        if name in loaded or name not in index or name in chain:
            return
        data = read(index[name])
        for dep in ",".join(_modinfo(data, "depends")).split(","):
            if dep:
                add(dep, chain + (name,))
        loaded[name] = data
    for name in GUEST_MODULES:
        add(name)
    return loaded


def _download(apt: Apt, packages: tuple[str, ...], version: str, where: Path,
              spec: str) -> list[str]:
    """Download and unpack `packages` at `version`; returns those fetched from
    the pool because the Packages index does not list them."""
    listed, unlisted = [], []
    for p in packages:
        have = apt.run("apt-cache", "madison", p, what=f"apt-cache madison {p}")
        (listed if any(line.split("|")[1].strip() == version
                       for line in have.splitlines()
                       if line.count("|") == 2 and line.rstrip().endswith(" Packages"))
         else unlisted).append(p)
    if listed:
        apt.run("apt-get", "download", *(f"{p}={version}" for p in listed), cwd=where,
                what=f"debian:{spec}: apt-get download {' '.join(listed)}")
    for p in unlisted:
        _from_pool(apt, p, version, where, spec)
    for deb in where.glob("*.deb"):
        proc.run(["dpkg-deb", "-x", str(deb), str(where / "x")], what=f"dpkg-deb -x {deb.name}")
    return unlisted


def _from_pool(apt: Apt, package: str, version: str, where: Path, spec: str) -> None:
    """A package the image depends on (name and version from its Depends) that
    the Packages index does not list: fetched from the directory the Sources
    index gives for the source package that builds it."""
    text = apt.run("apt-cache", "showsrc", package, what=f"apt-cache showsrc {package}")
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
    proc.run(["/usr/lib/apt/apt-helper", *apt.options(), "download-file", url, str(where / name)],
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
    raise MmlabError(f"unknown kernel '{name}' ({known}); add it with "
                     f"'mmlab kernels add {name if name.startswith('debian:') else 'PATH'}'")


def ensure(name: str, cache: Path | None = None) -> Kernel:
    """A kernel ready to boot: cached, or fetched now if it is a Debian one.
    A Debian kernel cached by an older mmlab (no modules, no package
    version) is fetched again."""
    try:
        k = get(name, cache)
    except MmlabError:
        if not name.startswith("debian:"):
            raise
        return add_debian(name.removeprefix("debian:"), cache)
    if name.startswith("debian:") and k.format < FORMAT:
        return add_debian(name.removeprefix("debian:"), cache)
    return k
