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

  versions.py  version order and release series
  catalog.py   the apt catalog: suites, mirrors, package lists, entries
  specs.py     kernel names and release ranges resolved against the catalog
  modules.py   the modules a guest loads for swap
  images.py    the kernel cache: fetch, register, look up
  kbuild.py    kernels built from source (a base's built tree kept, a patched
               kernel an incremental rebuild of it), patch A/B pairs, commit builds
  kconfig.py   a build's config: Debian's of that release (modules left unbuilt,
               the guest's needs built in, compared with Debian's) or tinyconfig
  series.py    a patch series read from format-patch files or an mbox, and the
               files and functions each patch changes
  qemu_plugin.py  mmlab's TCG plugin, built against Debian's qemu source
"""
