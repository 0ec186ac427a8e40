"""report.html's words for what summary.json records in raw form: a data source as its config gives it, and a Ray
node by its address and host name instead of its id."""

from __future__ import annotations

import json
from typing import Any

from convalue.engine.report.html_markup import Html, el, join, mapping, num

FEW = 6  # the groups of an include or exclude list named before "and N more"


def _few(names: list) -> str:
    shown = ", ".join(map(str, names[:FEW]))
    return shown + (f" and {len(names) - FEW} more" if len(names) > FEW else "")


def source_words(src: Any) -> str:
    """A source config (summary.json's config echo) in words: its kind, its path where it has one, the groups it
    keeps or drops, how it groups and into how many clusters (no clause for a field it does not set)."""
    c = mapping(src)
    words = str(c.get("kind") or "?")
    if c.get("path"):
        words += f" {c['path']}"
    if isinstance(c.get("include"), list) and c["include"]:
        words += f" ({_few(c['include'])})"
    if isinstance(c.get("exclude"), list) and c["exclude"]:
        words += f" without {_few(c['exclude'])}"
    if c.get("group_by"):
        words += f", by {c['group_by']}"
    if c.get("clusters"):
        words += f", in {c['clusters']} clusters"
    return words


def node_labels(gram: dict) -> dict[str, str]:
    """Each node id of the Gram stage's record as a person reads it: `the run's one machine (host, ip)` for a
    one-node cluster run from that node, else `node 1 (host, ip)`, ..., the driver's node first; a record without
    addresses (an older run) numbers its nodes."""
    tiles = mapping(gram.get("tiles_per_node"))
    info = {k: mapping(v) for k, v in mapping(gram.get("nodes")).items()}
    ids = sorted(dict.fromkeys([*tiles, *info]), key=lambda i: (not info.get(i, {}).get("driver"), str(i)))

    def where(i: str) -> str:
        parts = [str(p) for p in (info.get(i, {}).get("host"), info.get(i, {}).get("ip")) if p]
        return ", ".join(dict.fromkeys(parts))

    if ids == ["driver"]:  # a grown pool valued in the driver alone (engine/driver/prior.py): no Ray task ran
        return {"driver": "the driver (no Ray task)" + (f" ({where('driver')})" if where("driver") else "")}
    if len(ids) == 1 and info.get(ids[0], {}).get("driver"):
        return {ids[0]: "the run's one machine" + (f" ({where(ids[0])})" if where(ids[0]) else "")}
    return {i: f"node {n}" + (f" ({where(i)})" if where(i) else "") + (", the driver's"
                                                                        if info.get(i, {}).get("driver") else "")
            for n, i in enumerate(ids, start=1)}


def _size(n: float) -> str:
    """A byte count in binary units (12.3 MiB)."""
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    return ""


def gram_pairs(gram: dict) -> list[tuple[str, Any]]:
    """The Gram stage's record as rows of a key-value table: where its tiles ran by node name (the id on hover),
    bytes with thousands separators, any other field as JSON."""
    labels = node_labels(gram)
    tiles = mapping(gram.get("tiles_per_node"))
    pairs: list[tuple[str, Any]] = []
    for key, value in gram.items():
        if key == "nodes":
            continue
        if key == "tiles_per_node":
            cells = [join(el("span", labels.get(i, str(i)), title=f"Ray node id {i}"), f": {count}")
                     for i, count in sorted(tiles.items(), key=lambda kv: list(labels).index(kv[0])
                                            if kv[0] in labels else len(labels))]
            pairs.append(("tiles per node", Html("; ".join(cells)) if cells else "–"))
        elif key.startswith("bytes") and isinstance(value, (int, float)):
            pairs.append((key.replace("_", " "), join(num(value, ",d"), f" ({_size(value)})" if value >= 1024 else "")))
        else:
            pairs.append((key.replace("_", " "), json.dumps(value, default=str)))
    return pairs
