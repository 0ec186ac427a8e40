"""Incremental valuation through the public CLI: a clustered pool of N groups is valued with `convalue score`, grows
by a share of new groups (the same Parquet file, rows appended), and is valued again in the same run folder; the
baseline is a from-scratch valuation of the grown file, timed in the same process. Prints the time of each, their
ratio, whether the scores agree (objective, KKT, largest score difference, support), and ends with one JSON line.

    .venv/bin/python bench/incremental.py --n 20000 --p 8192               # 1 % appended, both gammas
    .venv/bin/python bench/incremental.py --n 100000 --p 8192 --gamma-ratio 0.05
    .venv/bin/python bench/incremental.py --n 20000 --p 8192 --space gradients --new aligned   # the answer changes

`--new drawn` (the default) appends rows drawn as the pool's own, which here leave the prior's answer standing;
`--new aligned` appends rows near the target's direction, which enter the support, so the prior only seeds the solve.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from scale import peak_memory, write_pool


def score(workdir: Path, name: str, ratio: float, extra: list[str]) -> dict:
    """One `convalue score` of workdir/pool.parquet into runs/<name>: its wall time, peak summed PSS and summary."""
    cmd = [sys.executable, "-m", "convalue", "score", str(workdir / "pool.parquet"), "--target",
           str(workdir / "target.npy"), "--gamma-ratio", str(ratio), "--k", "10", "--out", str(workdir / "runs"),
           "--name", name, *extra]
    if "--overwrite" in extra:  # valued from scratch: no store, no prior
        shutil.rmtree(workdir / "runs" / name, ignore_errors=True)
    stop, peak = threading.Event(), {}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sampler = threading.Thread(target=peak_memory, args=(proc, [], None, stop, peak), daemon=True)
    sampler.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"convalue score {name} failed: {err.strip().splitlines()[-1] if err.strip() else ''}")
    run = workdir / "runs" / name
    summary = json.loads((run / "summary.json").read_text())
    scores = {r["group"]: r["score"] for r in pq.read_table(run / "scores.parquet").to_pylist()}
    return {"wall_s": round(wall, 2), "peak_pss_gb": round(peak["pss"] / 2**30, 2), "summary": summary,
            "w": np.array([scores[g] for g in summary["order"]])}


def align_new_rows(path: Path, old_rows: int, seed: int = 1) -> None:
    """Rewrite the pool file with every row from old_rows on replaced by the target's direction plus noise (unit
    norm, cosine about 0.9 with the target); row groups are written as write_pool wrote them, so the leading ones
    keep their bytes."""
    g = np.load(path.with_name("target.npy")).astype(np.float64)
    g /= np.linalg.norm(g)
    rng = np.random.default_rng(seed)
    src = pq.ParquetFile(path)
    tables = [src.read_row_group(i) for i in range(src.num_row_groups)]
    tmp = path.with_suffix(".aligned")
    with pq.ParquetWriter(tmp, src.schema_arrow) as writer:
        start = 0
        for t in tables:
            if start + t.num_rows > old_rows:
                X = t.column("vector").combine_chunks().flatten().to_numpy().reshape(t.num_rows, -1).copy()
                lo = max(0, old_rows - start)
                noise = rng.standard_normal((t.num_rows - lo, X.shape[1])) * 0.5 / np.sqrt(X.shape[1])
                V = g + noise
                X[lo:] = (V / np.linalg.norm(V, axis=1, keepdims=True)).astype(np.float32)
                vec = pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1)), X.shape[1])
                t = t.set_column(t.schema.get_field_index("vector"), t.schema.field("vector"), vec)
            writer.write_table(t)
            start += t.num_rows
    tmp.replace(path)


def main() -> None:
    """Value, grow, value again against a fresh valuation; end with one JSON line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000, help="the pool before it grows")
    ap.add_argument("--p", type=int, default=8192)
    ap.add_argument("--grow", type=float, default=0.01, help="the share of new groups appended")
    ap.add_argument("--gamma-ratio", type=float, nargs="+", default=[5e-2, 5e-4])
    ap.add_argument("--space", choices=["auto", "gram", "gradients"], default="auto")
    ap.add_argument("--max-gather-gb", type=float, default=None, help="passed to convalue score")
    ap.add_argument("--new", choices=["drawn", "aligned"], default="drawn",
                    help="the appended rows: drawn as the pool's own, or near the target (they enter the support)")
    ap.add_argument("--workdir", type=Path, default=None, help="where the pool and runs go (default: a temp folder)")
    args = ap.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="convalue-incremental-"))
    workdir.mkdir(parents=True, exist_ok=True)
    total = args.n + max(1, int(round(args.grow * args.n)))
    extra = ["--space", args.space] + ([] if args.max_gather_gb is None else ["--max-gather-gb",
                                                                              str(args.max_gather_gb)])
    rows = []
    for ratio in args.gamma_ratio:
        write_pool(workdir / "pool.parquet", total, args.p, rows=args.n)  # the pool before it grew
        prior = score(workdir, f"grown-{ratio:g}", ratio, extra + ["--overwrite"])
        write_pool(workdir / "pool.parquet", total, args.p)  # the same file, the new rows appended
        if args.new == "aligned":
            align_new_rows(workdir / "pool.parquet", args.n)
        full = score(workdir, f"fresh-{ratio:g}", ratio, extra + ["--overwrite"])
        inc = score(workdir, f"grown-{ratio:g}", ratio, extra)
        s_full, s_inc = full["summary"], inc["summary"]
        assert s_inc["order"] == s_full["order"]
        row = {"n": args.n, "added": total - args.n, "new": args.new, "p": args.p, "gamma_ratio": ratio,
               "space": s_full.get("space"), "prior_s": prior["wall_s"], "full_s": full["wall_s"],
               "incremental_s": inc["wall_s"], "ratio": round(inc["wall_s"] / full["wall_s"], 4),
               "full_stages": s_full.get("timings_s"), "incremental_stages": s_inc.get("timings_s"),
               "full_peak_pss_gb": full["peak_pss_gb"], "incremental_peak_pss_gb": inc["peak_pss_gb"],
               "incremental": (s_inc.get("gram") or {}).get("incremental"),
               "objective_full": s_full["solver"]["objective"], "objective_incremental": s_inc["solver"]["objective"],
               "kkt_full": s_full["solver"]["kkt"], "kkt_incremental": s_inc["solver"]["kkt"],
               "max_abs_score_diff": float(np.abs(inc["w"] - full["w"]).max()),
               "same_support": bool(set(np.flatnonzero(inc["w"] > 1e-8)) == set(np.flatnonzero(full["w"] > 1e-8))),
               "nnz": s_full["solver"]["nnz"]}
        rows.append(row)
        print(f"N = {args.n} + {row['added']}, p = {args.p}, gamma_ratio = {ratio:g} ({row['space']}, "
              f"{row['nnz']} active): from scratch {row['full_s']:.1f} s, incremental {row['incremental_s']:.1f} s "
              f"= {row['ratio']:.3f} of it (prior: {row['incremental']}); objectives {row['objective_full']:.12g} / "
              f"{row['objective_incremental']:.12g}, KKT {row['kkt_incremental']:.1e}, largest score difference "
              f"{row['max_abs_score_diff']:.1e}, same support: {row['same_support']}", flush=True)
    print(json.dumps({"bench": "incremental", "workdir": str(workdir), "results": rows}))


if __name__ == "__main__":
    main()
