"""A command's figures from its output: stress-ng's YAML (`-Y FILE`),
`key=value` tokens, JSON lines.  Each parser gives every scalar the output
holds with where it was; `figures` keeps the finite numbers and insists on
the keys a workload needs (execwork.py), so a malformed output is one line
saying why."""

from __future__ import annotations

import json
import math
import re
from typing import Literal

import yaml

from mmlab.errors import MmlabError

METRICS_FROM = ("stress-ng-yaml", "key=value", "json")
MetricsFrom = Literal["stress-ng-yaml", "key=value", "json"]


def _number(text: object, where: str) -> float:
    """A figure: a finite number.  NaN, an infinity and a value past a
    double's range (1e400) are no figure a verdict can use: a metric that
    prints one fails its trial rather than be stored as missing."""
    if isinstance(text, bool) or not isinstance(text, int | float | str):
        raise MmlabError(f"{where}: {text!r} is not a number")
    try:
        value = float(text)
    except ValueError:
        raise MmlabError(f"{where}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise MmlabError(f"{where}: {text!r} is not a finite number")
    return value


# A parser gives every scalar the output holds: key -> (value as printed, where).
Raw = dict[str, tuple[object, str]]


def _stress_ng_yaml(text: str) -> Raw:
    """stress-ng -Y: `metrics` is a list of one mapping per stressor.  Every
    field is `STRESSOR.FIELD`, and plain `FIELD` when there is one stressor."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0]
        raise MmlabError(f"stress-ng YAML does not parse: {first}") from None
    rows = doc.get("metrics") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or not rows:
        raise MmlabError("stress-ng YAML has no 'metrics' list (run it with -Y {out} and "
                         "--metrics or --metrics-brief)")
    found: Raw = {}
    for row in rows:
        if not isinstance(row, dict) or "stressor" not in row:
            raise MmlabError(f"stress-ng YAML: a metrics entry without 'stressor': {row!r:.60}")
        for field, value in row.items():
            where = f"stress-ng YAML {row['stressor']}.{field}"
            found[f"{row['stressor']}.{field}"] = (value, where)
            if len(rows) == 1:
                found[field] = (value, where)
    return found


def _key_value(text: str) -> Raw:
    """Every `key=value` token, wherever it stands on a line."""
    found: Raw = {}
    for no, line in enumerate(text.splitlines(), 1):
        for token in line.split():
            key, eq, value = token.partition("=")
            if eq and re.fullmatch(r"[A-Za-z_][\w.-]*", key):
                found[key] = (value, f"key=value line {no}: {key}")
    return found


def _flatten(obj: object, prefix: str, out: Raw, where: str) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(v, f"{prefix}{k}.", out, where)
    elif not isinstance(obj, list):
        out[prefix[:-1]] = (obj, f"{where}: {prefix[:-1]}")


def _json_lines(text: str) -> Raw:
    """One JSON object per non-empty line; nested keys joined by dots."""
    found: Raw = {}
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise MmlabError(f"json line {no} is not JSON: {line.strip()[:60]!r}") from None
        if not isinstance(obj, dict):
            raise MmlabError(f"json line {no} is not a JSON object: {line.strip()[:60]!r}")
        _flatten(obj, "", found, f"json line {no}")
    return found


PARSERS = {"stress-ng-yaml": _stress_ng_yaml, "key=value": _key_value, "json": _json_lines}


def figures(metrics_from: str, text: str, wanted: tuple[str, ...] = (),
            not_negative: tuple[str, ...] = ()) -> dict[str, float]:
    """The figures a command's output holds, by key: every finite numeric
    one, and each `wanted` key, which must be a finite number, and not a
    negative one where it is among `not_negative` (a time, a size or a
    count).  MmlabError (one line) when the output is malformed or a wanted
    value is not such a number."""
    if not text.strip():
        raise MmlabError(f"the command printed no {metrics_from} output")
    found: dict[str, float] = {}
    for key, (value, where) in PARSERS[metrics_from](text).items():
        if key in wanted:
            found[key] = _number(value, where)
            if key in not_negative and found[key] < 0:
                raise MmlabError(f"{where}: {value!r} is negative, which a time, a size or "
                                 "a count cannot be")
        else:
            try:
                found[key] = _number(value, where)
            except MmlabError:
                continue        # text the command prints beside its figures
    return found
