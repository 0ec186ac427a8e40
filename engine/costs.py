"""Dataset prices for the cost-weighted budget sum_i c_i |w_i| <= B: read, match to groups, validate."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from engine.data import DataError


def load_costs(path: str | Path, names: list[str]) -> np.ndarray:
    """Prices of `names` (in that order) from a JSON object {group: price} or a Parquet file (group, cost)."""
    path = Path(path).expanduser()
    if path.suffix == ".json":
        try:
            table = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: invalid JSON ({exc.msg})") from None
        if not isinstance(table, dict):
            raise DataError(f"{path}: expected a JSON object {{group: price}}")
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        t = pq.read_table(path)
        missing = [c for c in ("group", "cost") if c not in t.column_names]
        if missing:
            raise DataError(f"{path}: missing column(s) {missing}; expected `group` and `cost`")
        table = dict(zip(t.column("group").to_pylist(), t.column("cost").to_pylist()))
    else:
        raise DataError(f"{path}: costs must be a .json or .parquet file")
    absent = [n for n in names if n not in table]
    if absent:
        raise DataError(f"{path}: no price for group(s) {absent[:10]}")
    out = []
    for n in names:
        c = table[n]
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c <= 0:
            raise DataError(f"{path}: price of group {n!r} must be a finite number > 0, got {c!r}")
        out.append(float(c))
    return np.array(out)
