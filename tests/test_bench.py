"""The engine's benches (the ones docs/performance.md quotes) still run and end with their JSON line (tiny sizes; no
timing asserted)."""

from __future__ import annotations

import pytest
from run_helpers import bench_json

pytestmark = pytest.mark.bench  # runs a bench script: `make bench-check`, not `make test`

def test_featurize_bench_gives_the_naive_loops_vectors_and_ends_with_json(tiny_model_dir):
    figures = bench_json("featurize.py", "--model", str(tiny_model_dir), "--groups", "2", "--m", "2",
                         "--groups-per-call", "1", "--rounds", "1", "--ray-idle-s", "0", "--dim", "512")
    assert figures["bench"] == "featurize" and figures["groups"] == 2 and figures["rounds"] == 1
    assert figures["min_cosine_naive_vs_convalue"] >= 0.999 and figures["max_abs_diff_1w_vs_2w"] == 0.0
    assert figures["speedup_1w_vs_naive"] > 0 and figures["speedup_2w_vs_1w"] > 0


def test_featurize_gpu_bench_dry_runs_on_the_cpu_and_ends_with_json(tiny_model_dir):
    figures = bench_json("featurize_gpu.py", "--device", "cpu", "--skip-ray", "--model", str(tiny_model_dir),
                         "--groups", "2", "--m", "2", "--max-length", "64", "--token-budget", "256",
                         "--groups-per-call", "2", "--cpu-groups", "1", "--grpo-prompts", "1",
                         "--grpo-generations", "2", "--dim", "512")
    assert figures["bench"] == "featurize_gpu" and figures["device"] == "cpu" and figures["gpu"] == "none"
    assert figures["cos_fp32_vs_naive"] >= 0.999 and figures["cos_fp32_gpu_vs_cpu"] >= 0.999


def test_clustering_bench_embeds_both_ways_and_ends_with_json():
    figures = bench_json("clustering.py", "--examples", "40", "--languages", "english", "--clusters", "4")
    assert figures["bench"] == "clustering" and figures["examples"] == 40 and figures["clusters"] == 4
    assert figures["max_abs_diff"] < 1e-4 and figures["driver_s"] > 0 and figures["ray_s"] > 0


def test_bootstrap_bench_spreads_the_same_resamples_and_ends_with_json():
    figures = bench_json("bootstrap.py", "--case", "40x64", "--m", "4", "--samples", "5", "--repeats", "1")
    assert figures["bench"] == "bootstrap" and figures["samples"] == 5 and figures["workers"] == 2
    assert figures["same_resamples"]  # one actor and two give the same resamples, bit for bit up to 1e-9


def test_gram_bench_agrees_with_the_product_and_ends_with_json():
    figures = bench_json("gram.py", "--n", "600", "--p", "64", "--block-rows", "32", "--rounds", "1")
    (case,) = figures["results"]
    assert case["n"] == 600 and case["max_rel_diff"] < 1e-12 and case["blocked_s"] > 0


def test_scale_bench_values_a_pool_through_the_cli_and_ends_with_json(tmp_path):
    figures = bench_json("scale.py", "--n", "400", "--p", "32", "--gamma-ratio", "0.05", "--workdir", str(tmp_path))
    (case,) = figures["results"]
    assert case["status"] == "complete" and case["kkt"] < 1e-6 and case["peak_rss_gb"] > 0
    assert set(case["stages"]) >= {"import", "gram", "solve", "total"}
