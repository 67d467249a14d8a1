"""Kernels on the terminal: the cached ones with their configs' features,
and what the Debian catalog can fetch (`mmlab kernels list|available`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from mmlab.kernels.catalog import Entry as CatalogEntry


def kernels_table(cached) -> Table:
    table = Table(title="cached kernels")
    for col in ("name", "version", "source", "config sha256", "features (m: module, -: absent)"):
        table.add_column(col, overflow="fold")
    for k in cached:
        feats = " ".join(f if v == "y" else f"{f}(m)" if v == "m" else f"-{f}"
                         for f, v in k.features().items())
        table.add_row(k.name, k.version, escape(k.source), k.config_sha256[:12], feats)
    return table


def catalog_table(entries: list[CatalogEntry], every_version: bool) -> Table:
    """The Debian kernel catalog: per release series its newest version (or,
    for one series, every version), with the name `--kernel` takes."""
    table = Table(title="Debian kernels mmlab can fetch")
    table.add_column("name", no_wrap=True)
    for col in ("version" if every_version else "newest", "package version", "flavour",
                "suite", "packaging"):
        table.add_column(col, overflow="fold")
    for e in entries:
        flavour = "" if e.flavour == "cloud" else f"-{e.flavour}"
        name = f"debian:{e.upstream if every_version else e.series}{flavour}"
        table.add_row(name, e.upstream, e.package_version, e.flavour, e.suite, e.packaging)
    return table
