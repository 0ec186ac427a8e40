"""The engine's benches still run and end with their JSON line (tiny sizes; no timing asserted)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def bench_json(script: str, *args: str, timeout: int = 300) -> dict:
    """Run bench/<script> with args and return the JSON line it ends with."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args],
                         capture_output=True, text=True, check=True, timeout=timeout).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_prefix_cache_bench_runs_and_ends_with_json(tiny_model_dir):
    figures = bench_json("prefix_cache.py", "--groups", "4", "--m", "1", "--groups-per-call", "2", "--passes", "1",
                         "--model", str(tiny_model_dir))
    assert figures["bench"] == "prefix_cache" and figures["max_abs_diff"] == 0.0
    assert figures["gflop"]["kept"] < figures["gflop"]["recomputed"] < figures["gflop"]["naive"]
    assert figures["kept_graph_mb_by_rows"]  # the 2-group prefix was kept


def test_contention_bench_phases_end_with_json():
    # the matmul workload runs the featuriser's three phases in spawned processes without loading the model
    figures = bench_json("contention.py", "--workload", "matmul", "--matmuls", "1", "--passes", "2")
    assert figures["bench"] == "contention" and figures["workload"] == "matmul"
    shape = {phase: [len(proc) for proc in procs] for phase, procs in figures["pass_s"].items()}
    assert shape == {"alone_1": [2], "two": [2, 2], "alone_2": [2]}
    assert figures["gflop_s_alone"] > 0 and figures["median_pass_s"]["two"] > 0
    warm = {phase: [t for proc in procs for t in proc[1:]] for phase, procs in figures["pass_s"].items()}
    alone, two = statistics.median(warm["alone_1"] + warm["alone_2"]), statistics.median(warm["two"])
    # first passes left out; pass_s is rounded to 1 ms, hence the tolerance
    assert abs(figures["slowdown_two_vs_alone"] - (two / alone - 1)) <= 0.0011 * (1 + two / alone) / alone + 1e-4


def test_clustering_bench_embeds_both_ways_and_ends_with_json():
    figures = bench_json("clustering.py", "--examples", "40", "--languages", "english", "--clusters", "4")
    assert figures["bench"] == "clustering" and figures["examples"] == 40 and figures["clusters"] == 4
    assert figures["max_abs_diff"] < 1e-4 and figures["driver_s"] > 0 and figures["ray_s"] > 0


def test_bootstrap_bench_spreads_the_same_resamples_and_ends_with_json():
    figures = bench_json("bootstrap.py", "--case", "40x64", "--m", "4", "--samples", "5", "--repeats", "1")
    assert figures["bench"] == "bootstrap" and figures["samples"] == 5 and figures["workers"] == 2
    assert figures["same_resamples"]  # one actor and two give the same resamples, bit for bit up to 1e-9


def test_store_reads_bench_reads_less_for_the_same_results_and_ends_with_json():
    figures = bench_json("store_reads.py", "--case", "40x64", "--repeats", "1")
    assert figures["bench"] == "store_reads" and figures["same_results"]
    assert figures["now_mb_read"] < figures["former_mb_read"]  # bytes, not time: deterministic


def test_cluster_samples_bench_prints_the_same_text_and_ends_with_json():
    figures = bench_json("cluster_samples.py", "--examples", "500", "--clusters", "20", "--named", "4", "--repeat", "1")
    assert figures["bench"] == "cluster_samples" and figures["same_text"] and figures["named"] == 4
