"""Large candidate pools through the public CLI: synthetic clustered pools of N groups at p dimensions written as a
Parquet of (group, vector) rows (streamed: the bench never holds the pool), then valued with `convalue score`
(import into a run folder's store, the blocked Gram or the gradient-space problem, the KMM solve, the selection).

Per case: the seconds of each stage (from the run's summary.json: import, load, gram, solve), the total wall time
and the peak memory of every process of the run, sampled every 0.5 s: the summed RSS (which counts each page of
Ray's object store in every process that maps it) and the summed PSS (which counts it once), the driver's peak
(the `convalue score` process), and with --nodes each simulated node's peak (its raylet and every process under it;
the head's also Ray's own GCS and monitors). With --nodes K the run joins a `ray.cluster_utils.Cluster` of K nodes
on this machine, each with its own object store and memory limits (--node-store-gb, --node-memory-gb); the run's
folder is on the local disk every node shares, so each node loads and multiplies its own share of the blocks.
Every case is one line of JSON at the end (keys n, p, nodes, gamma_ratio, total_s, peak_rss_gb, peak_pss_gb,
driver_peak_gb, node_peak_gb, bytes_moved, status, kkt, stages, sharded).

    .venv/bin/python bench/scale.py                                   # N in 10000, 30000, 100000 at p = 8192,
                                                                      # gamma_ratio 5e-2 and 5e-4
    .venv/bin/python bench/scale.py --n 10000 --p 4096 --gamma-ratio 0.05     # one case
    .venv/bin/python bench/scale.py --n 1000000 --p 1024 --nodes 4 --gamma-ratio 0.05
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


def pool_chunks(n: int, p: int, seed: int = 0, chunk: int = 4096):
    """synthetic.clustered_gradients(n, p, seed=seed)'s rows, chunk by chunk (the same draws in the same order, so
    the same bits), then its target: yields (start, rows float32) and returns g_tar."""
    rng = np.random.default_rng(seed)
    n_clusters = max(2, n // 20)
    centers = rng.standard_normal((n_clusters, p)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    labels = rng.integers(0, n_clusters, size=n)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        noise = (0.35 * rng.standard_normal((hi - lo, p)).astype(np.float32)).astype(np.float64) / np.sqrt(p)
        G = centers[labels[lo:hi]] + noise
        G /= np.linalg.norm(G, axis=1, keepdims=True)
        yield lo, G.astype(np.float32)
    mix = rng.standard_normal(min(8, n_clusters)).astype(np.float32)
    g_noise = (0.5 * rng.standard_normal(p).astype(np.float32)).astype(np.float64) / np.sqrt(p)
    g_tar = mix @ centers[: len(mix)] + g_noise
    return (g_tar / np.linalg.norm(g_tar)).astype(np.float32)


def write_pool(path: Path, n: int, p: int, seed: int = 0, rows: int | None = None) -> None:
    """N clustered unit-norm vectors as a Parquet of (group, vector) rows (the first `rows` of them only, when
    given: the pool before it grew), and the target as target.npy beside it."""
    schema = pa.schema([("group", pa.string()), ("vector", pa.list_(pa.float32(), p))])
    keep = n if rows is None else rows
    chunks = pool_chunks(n, p, seed)
    with pq.ParquetWriter(path, schema) as writer:
        while True:
            try:
                start, X = next(chunks)
            except StopIteration as stop:
                np.save(path.with_name("target.npy"), stop.value)
                break
            X = X[:max(0, keep - start)]
            if len(X):
                vec = pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1)), p)
                writer.write_table(pa.table({"group": [f"g{i:07d}" for i in range(start, start + len(X))],
                                             "vector": vec}, schema=schema))


def _pss(p: psutil.Process) -> int:
    try:
        return p.memory_full_info().pss
    except (psutil.Error, AttributeError):
        return 0


def _tree(p: psutil.Process) -> list[psutil.Process]:
    try:
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return []


def peak_memory(driver: subprocess.Popen, nodes: list[psutil.Process], extra: psutil.Process | None,
                stop: threading.Event, out: dict) -> None:
    """The largest sums of RSS and PSS over every process of the run, sampled until stop is set: the driver's tree,
    each node's (its raylet's tree; node 0 also `extra`'s other processes: the head's GCS and monitors), each
    peak on its own, and the processes' PSS at the summed peak."""
    root = psutil.Process(driver.pid)
    out.update(rss=0, pss=0, driver=0, nodes=[0] * max(1, len(nodes)), at_peak={})
    while not stop.is_set():
        try:
            groups = {"driver": _tree(root)}
            seen = {q.pid for q in groups["driver"]}
            for k, raylet in enumerate(nodes):
                groups[f"node{k}"] = [q for q in _tree(raylet) if q.pid not in seen]
                seen |= {q.pid for q in groups[f"node{k}"]}
            if extra is not None:  # the cluster's own processes outside any raylet: the head's
                groups["node0"] = groups.get("node0", []) + [q for q in _tree(extra)[1:] if q.pid not in seen]
            pss = {name: {q.pid: _pss(q) for q in procs} for name, procs in groups.items()}
            rss = sum(q.memory_info().rss for procs in groups.values() for q in procs if q.is_running())
            out["rss"] = max(out["rss"], rss)
            for k in range(len(nodes)):
                out["nodes"][k] = max(out["nodes"][k], sum(pss[f"node{k}"].values()))
            if nodes:
                out["driver"] = max(out["driver"], sum(pss["driver"].values()))
            else:  # an embedded Ray: the driver is its own process, everything below it its one node
                own = pss["driver"].get(root.pid, 0)
                out["nodes"][0] = max(out["nodes"][0], sum(pss["driver"].values()) - own)
                out["driver"] = max(out["driver"], own)
            total = sum(sum(v.values()) for v in pss.values())
            if total > out["pss"]:
                names = {q.pid: " ".join(q.cmdline()[:3])[:60] for procs in groups.values() for q in procs}
                out["pss"] = total
                out["at_peak"] = {f"{pid}:{names.get(pid, '')}": b for v in pss.values() for pid, b in v.items()}
        except psutil.Error:
            pass
        time.sleep(0.5)


class Nodes:
    """A ray.cluster_utils.Cluster of K nodes on this machine, each with its own object store and memory limits."""

    def __init__(self, k: int, cpus: int, store_gb: float, memory_gb: float):
        from ray.cluster_utils import Cluster  # only with --nodes

        args = {"num_cpus": cpus, "object_store_memory": int(store_gb * 2**30), "memory": int(memory_gb * 2**30)}
        self.cluster = Cluster(initialize_head=True, head_node_args=args | {"include_dashboard": False})
        for _ in range(k - 1):
            self.cluster.add_node(**args)
        self.cluster.wait_for_nodes()
        self.address = self.cluster.address
        me = psutil.Process()
        self.raylets = [q for q in me.children(recursive=True) if "raylet" in " ".join(q.cmdline()[:1])]

    def close(self) -> None:
        self.cluster.shutdown()


def case(workdir: Path, n: int, p: int, ratio: float, nodes: Nodes | None, max_gather_gb: float | None,
         space: str = "auto") -> dict:
    """Write one pool (once per n, p) and value it with `convalue score`."""
    pool = workdir / f"pool-{n}-{p}.parquet"
    t0 = time.perf_counter()
    if not pool.exists():
        write_pool(pool, n, p)
        (workdir / "target.npy").rename(workdir / f"target-{n}-{p}.npy")
    write_s = time.perf_counter() - t0
    name = f"scale-{n}-{p}-{ratio:g}" + (f"-{len(nodes.raylets)}nodes" if nodes else "")
    cmd = [sys.executable, "-m", "convalue", "score", str(pool), "--target", str(workdir / f"target-{n}-{p}.npy"),
           "--gamma-ratio", str(ratio), "--k", "10", "--out", str(workdir / "runs"), "--name", name, "--overwrite",
           "--space", space]
    if max_gather_gb is not None:
        cmd += ["--max-gather-gb", str(max_gather_gb)]
    shutil.rmtree(workdir / "runs" / name, ignore_errors=True)  # valued from scratch: no store, no prior
    env = dict(os.environ) | ({"RAY_ADDRESS": nodes.address} if nodes else {})
    stop, peak = threading.Event(), {}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    sampler = threading.Thread(target=peak_memory, daemon=True,
                               args=(proc, nodes.raylets if nodes else [], psutil.Process() if nodes else None,
                                     stop, peak))
    sampler.start()
    _, err = proc.communicate()
    total = time.perf_counter() - t0
    stop.set()
    sampler.join()
    summary_path = workdir / "runs" / name / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    solver, gram = summary.get("solver") or {}, summary.get("gram") or {}
    sharded = gram.get("sharded") or {}
    moved = {"gram_tiles": gram.get("bytes_moved", 0), "product_tasks": sharded.get("bytes_moved", 0),
             "to_solver": sharded.get("bytes_to_solver", 0)}
    gb = 2**30
    row = {"n": n, "p": p, "nodes": len(nodes.raylets) if nodes else 1, "gamma_ratio": ratio,
           "total_s": round(total, 2), "write_s": round(write_s, 2),
           "peak_rss_gb": round(peak["rss"] / gb, 2), "peak_pss_gb": round(peak["pss"] / gb, 2),
           "driver_peak_gb": round(peak["driver"] / gb, 2),
           "node_peak_gb": [round(v / gb, 2) for v in peak["nodes"]],
           "bytes_moved": sum(moved.values()), "bytes_moved_by": moved,
           "pss_at_peak_gb": {k: round(v / gb, 2) for k, v in sorted(peak["at_peak"].items(),
                                                                    key=lambda kv: -kv[1])[:6]},
           "status": summary.get("status", f"exit {proc.returncode}"),
           "kkt": solver.get("kkt"), "nnz": solver.get("nnz"), "method": solver.get("method"),
           "space": summary.get("space"), "stages": summary.get("timings_s"), "returncode": proc.returncode,
           "sharded": {k: sharded.get(k) for k in ("passes", "rows_read", "rows_from_blocks", "held_bytes",
                                                    "block_bytes_per_node",
                                                    "tasks_per_node", "pass_seconds") if k in sharded} or None}
    if proc.returncode != 0:
        row["error"] = err.strip().splitlines()[-1] if err.strip() else ""
    print(f"N = {n:>7}, p = {p}, {row['nodes']} node(s), gamma_ratio = {ratio:g}: {row['status']} in "
          f"{row['total_s']:.1f} s (stages {row['stages']}), peak {row['peak_pss_gb']:.2f} GB summed PSS "
          f"({row['peak_rss_gb']:.2f} GB summed RSS), driver {row['driver_peak_gb']:.2f} GB, nodes "
          f"{row['node_peak_gb']} GB, {row['bytes_moved'] / 1e6:.1f} MB moved between nodes, KKT {row['kkt']}, "
          f"{row['nnz']} active ({row['method']})", flush=True)
    return row


def main() -> None:
    """Run the cases; end with one JSON line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    ap.add_argument("--p", type=int, default=8192)
    ap.add_argument("--gamma-ratio", type=float, nargs="+", default=[5e-2, 5e-4])
    ap.add_argument("--nodes", type=int, default=0, help="value on a ray.cluster_utils.Cluster of this many nodes "
                    "(0: the embedded Ray the CLI starts)")
    ap.add_argument("--node-cpus", type=int, default=1)
    ap.add_argument("--node-store-gb", type=float, default=2.0, help="each node's object store")
    ap.add_argument("--node-memory-gb", type=float, default=4.0, help="each node's memory share (Ray's `memory`)")
    ap.add_argument("--max-gather-gb", type=float, default=None, help="passed to convalue score")
    ap.add_argument("--space", choices=["auto", "gram", "gradients"], default="auto", help="passed to convalue score")
    ap.add_argument("--workdir", type=Path, default=None, help="where pools and runs go (default: a temp folder)")
    args = ap.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="convalue-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    nodes = Nodes(args.nodes, args.node_cpus, args.node_store_gb, args.node_memory_gb) if args.nodes else None
    try:
        rows = [case(workdir, n, args.p, r, nodes, args.max_gather_gb, args.space) for n in args.n
                for r in args.gamma_ratio]
    finally:
        if nodes is not None:
            nodes.close()
    limits = ({"node_store_gb": args.node_store_gb, "node_memory_gb": args.node_memory_gb,
               "node_cpus": args.node_cpus} if nodes else None)
    print(json.dumps({"bench": "scale", "workdir": str(workdir), "node_limits": limits, "results": rows}))


if __name__ == "__main__":
    main()
