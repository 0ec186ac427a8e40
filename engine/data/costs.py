"""Dataset prices for the cost-weighted budget sum_i c_i |w_i| <= B: read, match to groups, validate."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from convalue.engine.data.examples import DataError, read_parquet


def _unique(path: Path, pairs: Iterable[tuple]) -> dict:
    """{group: price}, refusing a group priced twice (which price holds would be a guess)."""
    table: dict = {}
    for group, price in pairs:
        if group in table:
            raise DataError(f"{path}: group {group!r} has two prices ({table[group]!r} and {price!r})")
        table[group] = price
    return table


class _Pairs(list):
    """A JSON object as its (key, value) pairs in file order, so that a repeated key can be seen."""


def _read_json(path: Path) -> dict:
    try:
        table = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_Pairs)
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text; save the file as UTF-8") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: invalid JSON ({exc.msg})") from None
    if not isinstance(table, _Pairs):
        raise DataError(f"{path}: expected a JSON object {{group: price}}")
    return _unique(path, table)


def _read_parquet(path: Path) -> dict:
    t = read_parquet(path)
    missing = [c for c in ("group", "cost") if c not in t.column_names]
    if missing:
        raise DataError(f"{path}: missing column(s) {missing}; expected `group` and `cost`")
    return _unique(path, zip(t.column("group").to_pylist(), t.column("cost").to_pylist()))


def load_costs(path: str | Path, names: list[str]) -> np.ndarray:
    """Prices of `names` (in that order) from a JSON object {group: price} or a Parquet file (group, cost)."""
    path = Path(path).expanduser()
    if path.suffix == ".json":
        table = _read_json(path)
    elif path.suffix == ".parquet":
        table = _read_parquet(path)
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
