"""Debian's kernel catalog, read with mmlab's own apt: the suites it lists,
the mirror the host uses, the package lists, and one Entry per kernel
package of every suite (both packagings).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from mmlab import environ
from mmlab.errors import MmlabError
from mmlab.kernels.versions import VersionKey, series_key, series_of, upstream
from mmlab.machine import paths, proc

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
            words = re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb":
                out.append((words[1], [words[2]]))
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
    apt uses, or $MMLAB_APT_MIRROR (its security archive is URI-security),
    refused in one line unless it is a plain http(s) URL."""
    env = environ.url("MMLAB_APT_MIRROR")
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
    """mmlab's own apt: sources, lists, state and archives under `root`.
    A refresh reads new lists in a staging root of its own (ROOT/refresh)
    and moves them in only when the mirror answered."""

    # What a staging root's refresh replaces in the last good one.
    PARTS = ("sources.list", "lists", "cache", "state", "status", "archives")

    def __init__(self, root: Path | None = None):
        self.root = root or paths.cache_root() / "apt"

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
        """Whether the lists on disk are the ones wanted, and young enough:
        the state names the sources it was read with, and both the wanted
        sources and the sources.list on disk must be that text (a list
        written by hand, or left by an older mmlab, is read again)."""
        st = self._state()
        try:
            on_disk = (self.root / "sources.list").read_text()
        except OSError:
            return False
        return (st.get("sources") == self.sources() == on_disk
                and time.time() - st.get("updated", 0) < environ.seconds(
                    "MMLAB_APT_MAX_AGE_S", MAX_AGE_S)
                and (self.root / "catalog.json").exists() and (self.root / "lists").is_dir())

    def refresh(self, force: bool = False) -> None:
        """Read the package lists of every suite the mirror serves (apt-get
        update with mmlab's config), unless they are fresh.  One process
        refreshes at a time; the lists are read in a staging root and take
        the last good ones' place only when the mirror answered, so a failed
        refresh leaves the sources, lists, catalog and state as they were."""
        if not force and self.fresh():
            return
        text = self.sources()               # a bad mirror is refused before any write
        with paths.filling(self.root):
            if not force and self.fresh():
                return                      # another process refreshed meanwhile
            stage = Apt(self.root / "refresh")
            shutil.rmtree(stage.root, ignore_errors=True)
            try:
                stage._prepare(text, self.root / "lists")
                served = stage._update()
                self._promote(stage, stage._read_catalog(), served, text)
            finally:
                shutil.rmtree(stage.root, ignore_errors=True)

    def _prepare(self, text: str, lists: Path) -> None:
        """An apt root with `text` as its sources and the last good lists
        linked in (apt then asks the mirror only for what changed; it
        replaces a list by renaming, so the last good ones stay as they are)."""
        for d in ("lists/partial", "archives/partial", "cache", "state"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "status").touch()
        (self.root / "sources.list").write_text(text)
        for f in lists.glob("*") if lists.is_dir() else ():
            if f.is_file():
                os.link(f, self.root / "lists" / f.name)

    def _update(self) -> list[str]:
        """apt-get update: the suites the mirror served, or the reason none was."""
        out = proc.call(["apt-get", *self.options(), "update"], check=False, timeout=900,
                        what="apt-get update (mmlab's Debian catalog)")
        archive, security = mirrors()
        served = [s for uri, suites in ((archive, SUITES), (security, SECURITY_SUITES)) if uri
                  for s in suites if self._has_release(uri, s)]
        if not served:
            reasons = re.findall(r"^\s+(\S.*)$", out.stdout, re.M) or \
                out.stderr.strip().splitlines()[-1:] or ["no answer"]
            raise MmlabError(f"the Debian registry at {archive} cannot be reached: "
                             f"{reasons[0].strip()}")
        return served

    def _promote(self, stage: Apt, catalog: list[dict], served: list[str], text: str) -> None:
        """Move a refreshed stage's parts in.  The state goes first and comes
        back last, so a crash between leaves no state: the next run refreshes."""
        (self.root / "state.json").unlink(missing_ok=True)
        for part in self.PARTS:
            old = self.root / part
            if old.exists():
                old.rename(stage.root / f"old-{part}")
            (stage.root / part).rename(old)
        _write(self.root / "catalog.json", json.dumps(catalog))
        _write(self.root / "state.json",
               json.dumps({"sources": text, "updated": time.time(), "served": served}))

    def _has_release(self, uri: str, suite: str) -> bool:
        """apt names a list file after its URI: host_path_dists_SUITE_InRelease."""
        prefix = re.sub(r"^\w+://", "", uri).replace("/", "_")
        return any((self.root / "lists" / f"{prefix}_dists_{suite}_{n}").exists()
                   for n in ("InRelease", "Release"))

    def served(self) -> list[str]:
        return self._state().get("served", [])

    def call(self, tool: str, *args: str, cwd: Path | None = None, what: str = "") -> str:
        """An apt tool's output, run with this apt's own lists and options."""
        return proc.call([tool, *self.options(), *args], cwd=cwd, timeout=1800,
                         what=what or f"{tool} {args[0] if args else ''}").stdout

    def _read_catalog(self) -> list[dict]:
        names = [n for prefix in ("linux-image-", "linux-binary-", "linux-source-")
                 for n in self.call("apt-cache", "pkgnames", prefix).split()
                 if PACKAGE.match(n)]
        rows = []
        if names:
            for line in self.call("apt-cache", "madison", *sorted(set(names))).splitlines():
                parts = [p.strip() for p in line.split("|")]
                if len(parts) == 3:
                    m = re.search(r"\s(\S+?)/\S+\s+\S+\s+Packages", parts[2])
                    rows.append({"package": parts[0], "version": parts[1],
                                 "suite": m.group(1) if m else "?"})
        return rows

    def catalog(self) -> list[dict]:
        self.refresh()
        return json.loads((self.root / "catalog.json").read_text())

    def last_catalog(self) -> list[dict] | None:
        """The catalog as last read, however old (nothing is downloaded);
        None when it was never read."""
        try:
            return json.loads((self.root / "catalog.json").read_text())
        except (OSError, ValueError):
            return None


def _write(path: Path, text: str) -> None:
    """`path` holds `text` whole or is left as it was (written beside, renamed)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    tmp.rename(path)


# linux-image-ABI-FLAVOUR[-unsigned], linux-binary-ABI-FLAVOUR, linux-source-X.Y
PACKAGE = re.compile(r"^linux-(?:(image|binary)-"
                     r"(\d+\.\d+(?:\.\d+)?(?:-\d+)?(?:\+deb\d+(?:\.\d+)?)?)"
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
    return sorted(found.values(), key=lambda e: (e.flavour, VersionKey(e.package_version)))



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
    return sorted(newest.values(), key=lambda e: (e.flavour, series_key(e.series)))


def series_available(apt: Apt | None = None, flavour: str = "cloud") -> list[str]:
    return sorted({e.series for e in entries((apt or Apt()).catalog()) if e.flavour == flavour},
                  key=series_key)
