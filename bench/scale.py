"""Large candidate pools through the public CLI: synthetic clustered pools of N groups at p dimensions written as a
Parquet of (group, vector) rows, then valued with `convalue score` (import into a run folder's store, the blocked
Gram or the gradient-space problem, the KMM solve, the selection, the report).

Per case: the seconds of each stage (from the run's summary.json: import, load, gram, solve), the total wall time
and the peak memory of the whole process tree (the CLI and its Ray workers, sampled every 0.2 s), the solver's
status and KKT violation. Every case is one line of JSON at the end (keys n, p, gamma_ratio, total_s,
peak_rss_gb, status, kkt, stages).

    .venv/bin/python bench/scale.py                                   # N in 10000, 30000, 100000 at p = 8192,
                                                                      # gamma_ratio 5e-2 and 5e-4
    .venv/bin/python bench/scale.py --n 10000 --p 4096 --gamma-ratio 0.05     # one case
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
from synthetic import clustered_gradients


def write_pool(path: Path, n: int, p: int, seed: int = 0, chunk: int = 4096) -> None:
    """N clustered unit-norm vectors as a Parquet of (group, vector) rows, and the target as target.npy."""
    G, g = clustered_gradients(n, p, seed=seed)
    np.save(path.with_name("target.npy"), np.asarray(g, np.float32))
    schema = pa.schema([("group", pa.string()), ("vector", pa.list_(pa.float32(), p))])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, n, chunk):
            rows = np.asarray(G[start:start + chunk], np.float32)
            vec = pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), p)
            writer.write_table(pa.table({"group": [f"g{i:06d}" for i in range(start, start + len(rows))],
                                         "vector": vec}, schema=schema))


def peak_rss(proc: subprocess.Popen, stop: threading.Event, out: list[float]) -> None:
    """The largest sum of RSS over proc and its descendants, sampled until stop is set."""
    root = psutil.Process(proc.pid)
    while not stop.is_set():
        try:
            procs = [root, *root.children(recursive=True)]
            out[0] = max(out[0], sum(p.memory_info().rss for p in procs if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.2)


def case(workdir: Path, n: int, p: int, ratio: float) -> dict:
    """Write one pool (once per n, p) and value it with `convalue score`."""
    pool = workdir / f"pool-{n}-{p}.parquet"
    t0 = time.perf_counter()
    if not pool.exists():
        write_pool(pool, n, p)
        (workdir / "target.npy").rename(workdir / f"target-{n}-{p}.npy")
    write_s = time.perf_counter() - t0
    name = f"scale-{n}-{p}-{ratio:g}"
    cmd = [sys.executable, "-m", "convalue", "score", str(pool), "--target", str(workdir / f"target-{n}-{p}.npy"),
           "--gamma-ratio", str(ratio), "--k", "10", "--out", str(workdir / "runs"), "--name", name, "--overwrite"]
    stop, peak = threading.Event(), [0.0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sampler = threading.Thread(target=peak_rss, args=(proc, stop, peak), daemon=True)
    sampler.start()
    _, err = proc.communicate()
    total = time.perf_counter() - t0
    stop.set()
    summary_path = workdir / "runs" / name / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    solver = summary.get("solver") or {}
    row = {"n": n, "p": p, "gamma_ratio": ratio, "total_s": round(total, 2), "write_s": round(write_s, 2),
           "peak_rss_gb": round(peak[0] / 2**30, 2), "status": summary.get("status", f"exit {proc.returncode}"),
           "kkt": solver.get("kkt"), "nnz": solver.get("nnz"), "space": summary.get("space"),
           "stages": summary.get("timings_s"), "returncode": proc.returncode}
    if proc.returncode != 0:
        row["error"] = err.strip().splitlines()[-1] if err.strip() else ""
    print(f"N = {n:>6}, p = {p}, gamma_ratio = {ratio:g}: {row['status']} in {row['total_s']:.1f} s "
          f"(stages {row['stages']}), peak {row['peak_rss_gb']:.2f} GB, KKT {row['kkt']}, {row['nnz']} active",
          flush=True)
    return row


def main() -> None:
    """Run the cases; end with one JSON line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    ap.add_argument("--p", type=int, default=8192)
    ap.add_argument("--gamma-ratio", type=float, nargs="+", default=[5e-2, 5e-4])
    ap.add_argument("--workdir", type=Path, default=None, help="where pools and runs go (default: a temp folder)")
    args = ap.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="convalue-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows = [case(workdir, n, args.p, r) for n in args.n for r in args.gamma_ratio]
    print(json.dumps({"bench": "scale", "workdir": str(workdir), "results": rows}))


if __name__ == "__main__":
    main()
