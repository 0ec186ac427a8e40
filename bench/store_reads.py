"""The vector store's reads on a resumed run, against the reader before 2026-11-24 (kept here as the baseline).

A store of N groups in blocks of 4 (p-dim vectors and, as with features.keep_per_example, m per-example vectors
each) plus the target is written once. Then, --repeats times alternately, each reader runs what a resumed run
with a bootstrap asks of it: open the store (every block's checksum, to know what is done), load every group's
vector (featurize's resume), load the target's (featurize's g_tar), and load every per-example vector (the
bootstrap). The former reader checked every block's checksum and parsed every column of every block on each
load; the current one reads only the blocks that hold the asked groups, checks the checksum on the bytes it
parses, and decodes only the asked columns. Prints the medians, the ratio, the bytes each read and whether the
results are equal; ends with one JSON line.

    .venv/bin/python bench/store_reads.py [--case 2000x4096] [--m 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.synthetic import case  # noqa: E402
from convalue.engine.data.prepare import TARGET_KEY  # noqa: E402
from convalue.engine.store.vectors import StoreError, VectorStore  # noqa: E402


class CountingStore(VectorStore):
    """VectorStore as it is, counting the bytes its checks and reads take from disk."""

    bytes_read = 0

    def _size(self, block: dict) -> int:
        return (self.root / block["file"]).stat().st_size

    def _valid(self, block: dict) -> bool:
        CountingStore.bytes_read += self._size(block)
        return super()._valid(block)

    def _tables(self, names: list[str], columns: list[str]):
        wanted = set(names)
        CountingStore.bytes_read += sum(self._size(b) for b in self.manifest["blocks"]
                                        if not wanted.isdisjoint(b["groups"]))
        yield from super()._tables(names, columns)


class FormerStore(CountingStore):
    """The block reader of c1786f4, counted the same way: every block, checksum first, then all its columns."""

    def _tables(self, names: list[str], columns: list[str]):
        for b in self.manifest["blocks"]:
            if not self._valid(b):
                raise StoreError(f"{self.root / b['file']}: checksum mismatch")
            CountingStore.bytes_read += self._size(b)
            yield pq.read_table(self.root / b["file"])


def build(root: Path, n: int, p: int, m: int) -> tuple[dict, list[str]]:
    """Write a store of n groups (blocks of 4) and the target; (its fingerprint, the group names)."""
    fp = {"model": "bench", "projection": {"kind": "countsketch", "dim": p, "seed": 0}}
    store = VectorStore(root, fp)
    rng = np.random.default_rng(0)
    names = [f"g{i:05d}" for i in range(n)]
    for chunk in [[TARGET_KEY]] + [names[i:i + 4] for i in range(0, n, 4)]:
        per = [rng.standard_normal((m, p), dtype=np.float32) for _ in chunk]
        store.write_block(chunk, [f"k-{c}" for c in chunk], [m] * len(chunk), [100 * m] * len(chunk),
                          np.stack([x.mean(axis=0) for x in per]), per)
    return fp, names


def resumed_run(cls, root: Path, fp: dict, names: list[str]) -> tuple[float, int, tuple]:
    """(seconds, bytes read, results) of open + load(all) + load(target) + load_examples(all, target)."""
    CountingStore.bytes_read = 0  # one counter: the readers run one after the other
    t0 = time.perf_counter()
    store = cls(root, fp)
    G, counts = store.load(names)
    g_tar, _ = store.load([TARGET_KEY])
    examples = store.load_examples(names + [TARGET_KEY])
    return time.perf_counter() - t0, CountingStore.bytes_read, (G, counts, g_tar, examples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", type=case, default=(2000, 4096), help="N x p (default 2000x4096)")
    ap.add_argument("--m", type=int, default=8, help="per-example vectors per group (default 8)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    (n, p), m = args.case, args.m
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "vectors"
        t0 = time.perf_counter()
        fp, names = build(root, n, p, m)
        built = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in root.glob("block-*.parquet"))
        times: dict[str, list[float]] = {"former": [], "now": []}
        read, results = {}, {}
        for _ in range(args.repeats):
            for name, cls in (("former", FormerStore), ("now", CountingStore)):
                t, read[name], results[name] = resumed_run(cls, root, fp, names)
                times[name].append(t)
    (G0, c0, g0, e0), (G1, c1, g1, e1) = results["former"], results["now"]
    same = bool(np.array_equal(G0, G1) and c0 == c1 and np.array_equal(g0, g1) and e0.keys() == e1.keys()
                and all(np.array_equal(e0[k], e1[k]) for k in e0))
    former, now = statistics.median(times["former"]), statistics.median(times["now"])
    mb = 2 ** 20
    print(f"store: N={n} p={p} m={m}, {size / mb:.0f} MB in {n // 4 + 1} blocks (written in {built:.1f} s)")
    print(f"resumed run's reads: former {former:.2f} s ({read['former'] / mb:.0f} MB read), now {now:.2f} s "
          f"({read['now'] / mb:.0f} MB read): {former / now:.2f}x; same results: {same}")
    print(json.dumps({"bench": "store_reads", "n": n, "p": p, "m": m, "store_mb": round(size / mb, 1),
                      "former_s": round(former, 3), "now_s": round(now, 3), "ratio": round(former / now, 3),
                      "former_mb_read": round(read["former"] / mb, 1), "now_mb_read": round(read["now"] / mb, 1),
                      "same_results": same, "times": {k: [round(t, 3) for t in v] for k, v in times.items()}}))


if __name__ == "__main__":
    main()
