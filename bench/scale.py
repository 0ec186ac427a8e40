"""Large candidate pools through the public CLI: synthetic clustered pools of N groups at p dimensions written as a
Parquet of (group, vector) rows, then valued with `convalue score` (import into a run folder's store, the blocked
Gram or the gradient-space problem, the KMM solve, the selection, the report).

Per case: the seconds of each stage (from the run's summary.json: import, load, gram, solve), the total wall time
and the peak memory of the whole process tree (the CLI and its Ray workers, sampled every 0.5 s: the summed RSS,
which counts each page of Ray's object store in every process that maps it, and the summed PSS, which counts it
once), the solver's status and KKT violation. Every case is one line of JSON at the end (keys n, p, gamma_ratio,
total_s, peak_rss_gb, peak_pss_gb, status, kkt, stages).

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


def _pss(p: psutil.Process) -> int:
    try:
        return p.memory_full_info().pss
    except (psutil.Error, AttributeError):
        return 0


def peak_memory(proc: subprocess.Popen, stop: threading.Event, out: dict) -> None:
    """The largest sums of RSS and of PSS over proc and its descendants, sampled until stop is set, and the
    processes' PSS at the PSS peak. RSS counts a page of Ray's object store once in every process that maps it;
    PSS shares it out, so the PSS sum is the memory the tree really holds."""
    root = psutil.Process(proc.pid)
    out.update(rss=0, pss=0, at_peak={})
    while not stop.is_set():
        try:
            procs = [p for p in (root, *root.children(recursive=True)) if p.is_running()]
            out["rss"] = max(out["rss"], sum(p.memory_info().rss for p in procs))
            pss = {f"{p.pid}:{' '.join(p.cmdline()[:3])[:60]}": _pss(p) for p in procs}
            if sum(pss.values()) > out["pss"]:
                out["pss"], out["at_peak"] = sum(pss.values()), pss
        except psutil.Error:
            pass
        time.sleep(0.5)


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
    stop, peak = threading.Event(), {}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sampler = threading.Thread(target=peak_memory, args=(proc, stop, peak), daemon=True)
    sampler.start()
    _, err = proc.communicate()
    total = time.perf_counter() - t0
    stop.set()
    summary_path = workdir / "runs" / name / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    solver = summary.get("solver") or {}
    row = {"n": n, "p": p, "gamma_ratio": ratio, "total_s": round(total, 2), "write_s": round(write_s, 2),
           "peak_rss_gb": round(peak["rss"] / 2**30, 2), "peak_pss_gb": round(peak["pss"] / 2**30, 2),
           "pss_at_peak_gb": {k: round(v / 2**30, 2) for k, v in sorted(peak["at_peak"].items(),
                                                                        key=lambda kv: -kv[1])[:5]},
           "status": summary.get("status", f"exit {proc.returncode}"),
           "kkt": solver.get("kkt"), "nnz": solver.get("nnz"), "space": summary.get("space"),
           "stages": summary.get("timings_s"), "returncode": proc.returncode}
    if proc.returncode != 0:
        row["error"] = err.strip().splitlines()[-1] if err.strip() else ""
    print(f"N = {n:>6}, p = {p}, gamma_ratio = {ratio:g}: {row['status']} in {row['total_s']:.1f} s "
          f"(stages {row['stages']}), peak {row['peak_rss_gb']:.2f} GB summed RSS, "
          f"{row['peak_pss_gb']:.2f} GB summed PSS, KKT {row['kkt']}, {row['nnz']} active",
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
