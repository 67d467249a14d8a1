"""Flame graphs as self-contained SVG, written here (no external assets).

A frame's width is its share of the samples; the root is at the bottom.
Plain graphs colour frames by a hash of the name (warm hues, as is usual);
differential graphs draw the arm's stacks and colour each frame by how its
CPU time per unit of work changed against the baseline: red grew, blue
shrank, white unchanged.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Callable
from html import escape
from pathlib import Path

from mmlab.attribution.explain import Explanation
from mmlab.names import safe_name

WIDTH = 1200
ROW = 16
MIN_PX = 0.3          # narrower frames are not drawn (they would not be seen)


def _tree(folded: Counter[str]) -> dict:
    root: dict = {"name": "all", "value": 0, "children": {}}
    for stack, w in folded.items():
        node = root
        node["value"] += w
        for frame in stack.split(";"):
            node = node["children"].setdefault(frame, {"name": frame, "value": 0,
                                                       "children": {}})
            node["value"] += w
    return root


def _warm(name: str) -> str:
    h = int(hashlib.md5(name.encode()).hexdigest()[:6], 16)
    return f"rgb({205 + h % 50},{(h >> 8) % 180 + 40},{(h >> 16) % 55})"


def _diverging(change: float, scale: float) -> str:
    x = max(-1.0, min(1.0, change / scale)) if scale else 0.0
    fade = int(255 * (1 - abs(x)))
    return f"rgb(255,{fade},{fade})" if x > 0 else f"rgb({fade},{fade},255)"


def render(folded: Counter[str], title: str,
           color_of: Callable[[tuple[str, ...]], str] | None = None, note: str = "") -> str:
    """The SVG text; `color_of(path)` may colour a frame by its path from the root."""
    root = _tree(folded)
    total = root["value"] or 1

    def depth(node: dict) -> int:
        return 1 + max((depth(c) for c in node["children"].values()), default=0)
    rows = depth(root)
    height = (rows + 3) * ROW
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'font-family="monospace" font-size="11">',
           f'<text x="{WIDTH / 2}" y="{ROW}" text-anchor="middle" font-size="14">'
           f'{escape(title)}</text>',
           f'<text x="4" y="{2 * ROW}" fill="#555">{escape(note)}</text>']

    def draw(node: dict, x: float, level: int, path: tuple[str, ...]) -> None:
        w = node["value"] / total * WIDTH
        if w < MIN_PX:
            return
        y = height - (level + 1) * ROW
        fill = color_of(path) if color_of else _warm(node["name"])
        share = node["value"] / total
        out.append(f'<g><title>{escape(node["name"])} ({share:.2%})</title>'
                   f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{ROW - 1}" '
                   f'fill="{fill}" rx="2"/>')
        chars = int(w / 7)
        if chars >= 3:
            label = node["name"] if len(node["name"]) <= chars else node["name"][:chars - 2] + ".."
            out.append(f'<text x="{x + 3:.2f}" y="{y + ROW - 4}">{escape(label)}</text>')
        out.append("</g>")
        cx = x
        for child in sorted(node["children"].values(), key=lambda c: c["name"]):
            draw(child, cx, level + 1, path + (child["name"],))
            cx += child["value"] / total * WIDTH

    draw(root, 0.0, 0, ())
    out.append("</svg>")
    return "\n".join(out) + "\n"


def differential(folded: Counter[str], units: float, base: Counter[str], base_units: float,
                 title: str) -> str:
    """The arm's flame graph coloured by the change of each frame's CPU time
    per unit of work against the baseline (same path from the root)."""
    def per_path(f: Counter[str], u: float) -> dict[tuple[str, ...], float]:
        acc: dict[tuple[str, ...], float] = defaultdict(float)
        for stack, w in f.items():
            frames = tuple(stack.split(";"))
            for i in range(1, len(frames) + 1):
                acc[frames[:i]] += w / u
        return acc
    a, b = per_path(folded, units), per_path(base, base_units)
    changes = {p: a[p] - b.get(p, 0.0) for p in a}
    scale = max((abs(v) for v in changes.values()), default=0.0)
    return render(folded, title, lambda path: _diverging(changes.get(path, 0.0), scale)
                  if path else "rgb(230,230,230)",
                  note=f"red: more CPU time per unit than the baseline, blue: less "
                       f"(full colour = {scale:,.0f} ns)")


def graphs(found: Explanation) -> dict[str, str]:
    """File name -> SVG: a flame graph per arm with perf stacks and a
    differential one per pair where both arms have them."""
    suffix = f" (stacks through {found.focus})" if found.focus else ""
    folded = {arm: p.stacks(found.focus) for arm, p in found.stacks.items()}
    out = {f"flame-{safe_name(arm)}.svg":
           render(f, f"{arm}: perf {found.stacks[arm].event}{suffix}")
           for arm, f in folded.items() if f}
    for p in found.pairs:
        fa, fb = folded.get(p.arm), folded.get(p.baseline)
        if fa and fb:
            out[f"diff-{safe_name(p.arm)}-vs-{safe_name(p.baseline)}.svg"] = differential(
                fa, found.stacks[p.arm].units, fb, found.stacks[p.baseline].units,
                f"{p.arm} vs {p.baseline}{suffix}")
    return out


def write(out: Path, found: Explanation) -> list[Path]:
    """The flame graphs as files in `out`, for `mmlab explain --svg` and bundles."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, svg in graphs(found).items():
        (out / name).write_text(svg)
        written.append(out / name)
    return written
