"""The solver benches still run and end with their JSON line (tiny sizes; no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def bench_json(script: str, *args: str, timeout: int = 300) -> dict:
    """Run bench/<script> with args and return the JSON line it ends with."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args],
                         capture_output=True, text=True, check=True, timeout=timeout).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_solver_bench_runs_and_ends_with_json():
    figures = bench_json("solvers.py", "--sizes", "30", "--p", "64")
    assert figures["bench"] == "solvers" and len(figures["results"]) == 2
    for r in figures["results"]:
        assert r["convalue_kkt"] < 1e-6 and r["convalue_obj"] <= r["cvxpy_obj"] + 1e-6
        assert r["validate_s"] > 0 and r["speedup_end_to_end_vs_cvxpy"] <= r["speedup_vs_cvxpy"]
        # the second row, at the accuracy: certified at tol, no worse than the reference
        assert r["tol"] == 1e-6 and r["convalue_tol_kkt"] <= 1e-6 and r["convalue_tol_obj"] <= r["cvxpy_obj"] + 1e-6
        assert r["speedup_tol_vs_cvxpy"] > 0


def test_early_stop_bench_certifies_both_answers_and_ends_with_json():
    figures = bench_json("early_stop.py", "--cases", "400x800", "near30:400x800", "--gammas", "2e-4", "2e-3",
                         "--rounds", "1", "--repeat", "1")
    assert figures["bench"] == "early_stop" and len(figures["cases"]) == 3
    dense, sparser, near = figures["cases"]
    assert dense["early_stop"] and 1e-12 < dense["kkt_now"] <= 1e-6 and dense["kkt_before"] <= 1e-12
    assert not sparser["early_stop"]  # a support cheap to factor keeps the polish
    assert near["data"] == "near" and near["mix"] == 30 and near["strategy_now"] == "working_set_homotopy"
    assert all(c["speedup"] > 0 and 0 <= c["objective_gap"] <= 1e-6 for c in figures["cases"])
    assert all(c["top3_same"] == c["top20_same"] == 1.0 and c["score_drift"] < 1e-3 for c in figures["cases"])


def test_early_stop_bench_against_plain_admm_steps_certifies_both_and_ends_with_json():
    figures = bench_json("early_stop.py", "--cases", "400x800", "--gammas", "2e-4", "--rounds", "1", "--repeat", "1",
                         "--versus", "plain")
    (case,) = figures["cases"]
    assert figures["versus"] == "plain" and case["early_stop"] and case["kkt_before"] <= 1e-6
    assert case["iterations_before"] > case["iterations_now"]  # Anderson's steps: fewer of them


def test_gradient_form_bench_forms_the_gram_and_agrees_and_ends_with_json():
    figures = bench_json("gradient_form.py", "--cases", "near:120x160", "clustered:200x300", "--rounds", "1")
    assert figures["bench"] == "gradient_form" and len(figures["cases"]) == 2
    assert all(c["gram_formed"] and c["same_support"] and c["kkt"] <= 1e-6 for c in figures["cases"])


def test_sparse_probe_bench_agrees_with_the_chain_without_it_and_ends_with_json():
    figures = bench_json("sparse_probe.py", "--cases", "near:1300x1250", "clustered:1300x1250", "near60:400x800",
                         "--forms", "gram", "--max-seconds", "60")
    assert figures["bench"] == "sparse_probe" and figures["probe_max"] > 0 and figures["admm_first_steps"] > 0
    near, clustered, mixed = figures["cases"]
    assert near["strategy_now"] == "working_set_homotopy" and near["strategy_before"] != near["strategy_now"]
    assert clustered["strategy_now"] == clustered["strategy_before"] == "admm_polish"  # the probe gave up
    # 109 active, past the probe: the working set after ADMM's first steps
    assert mixed["strategy_now"] == "working_set_homotopy" and mixed["active"] > figures["probe_max"]
    assert all(c["kkt"] <= 1e-6 and c["before_certified"] for c in figures["cases"]) and clustered["probe_s"] > 0


def test_sparse_probe_bench_against_the_unseeded_working_set_ends_with_json():
    figures = bench_json("sparse_probe.py", "--cases", "near60:400x800", "--forms", "gram", "--versus", "seed")
    (mixed,) = figures["cases"]
    assert figures["versus"] == "seed" and mixed["strategy_now"] == mixed["strategy_before"] == "working_set_homotopy"
    assert mixed["kkt"] <= 1e-6 and mixed["kkt_before"] <= 1e-6 and mixed["before_certified"]


def test_gradient_space_bench_runs_and_ends_with_json():
    figures = bench_json("gradient_space.py", "--n", "800", "--p", "1000", "--rounds", "3")
    assert figures["bench"] == "gradient_space" and figures["same_support"] and figures["active"] >= 256
    assert max(figures["kkt"].values()) <= 1e-6 and figures["speedup_vs_before"] > 0
    assert all(len(figures[f"{v}_s"]) == 3 for v in ("now", "no_reuse", "before"))


def test_rank_deficient_bench_runs_and_ends_with_json():
    figures = bench_json("rank_deficient.py", "--cases", "120x40", "--cap", "10")
    assert figures["bench"] == "rank_deficient" and len(figures["results"]) == 2
    for r in figures["results"]:
        assert r["rank"] == 40 and r["convalue_strategy"] == "homotopy"
        assert r["convalue_kkt"] < 1e-9
        assert r["convalue_obj"] <= min(r["cvxpy_obj"], r["former_obj"], r["sklearn_obj"]) + 1e-9
    (path,) = figures["paths"]
    assert path["points"] == 50 and max(path["path_kkt"], path["per_point_kkt"]) < 1e-9


def test_large_gram_bench_runs_both_branches_and_ends_with_json():
    figures = bench_json("large_gram.py", "--n", "400", "--p", "200", "--cap", "2")
    assert figures["bench"] == "large_gram"
    assert figures["rank_bound_result"] == 200 and figures["rank_without_bound"] is None
    assert figures["solve_strategy"] == "admm_polish" and figures["solve_converged"] and figures["solve_kkt"] < 1e-9
    assert figures["former_strategy"] != "admm_polish"


def test_synthetic_gradients_have_the_same_dtypes_under_any_numpy_promotion_rules():
    """numpy 1.26 kept the float32 draws float32 where numpy 2 promoted them: the benches' data differed."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from synthetic import clustered_gradients
    finally:
        sys.path.remove(str(ROOT / "bench"))
    import numpy as np

    G, g_tar = clustered_gradients(60, 32, seed=3)
    assert G.dtype == np.float64 and g_tar.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(G, axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(g_tar.astype(np.float64)), 1.0, rtol=1e-6)
    again, _ = clustered_gradients(60, 32, seed=3)  # one seed, one problem: the benches time methods on it in turn
    assert np.array_equal(G, again)


def test_validation_bench_compares_both_estimates_and_ends_with_json():
    figures = bench_json("validation.py", "--n", "600", "--p", "200")
    assert figures["bench"] == "validation" and figures["sym_identical"] and figures["rank"] == 200
    assert figures["sym_peak_mb"] < figures["sym_former_peak_mb"]  # the symmetrised copy only, not two more
    assert figures["psd_lobpcg_value"] >= -1e-9  # never below lambda_min: a PSD K passes
    assert figures["noisy_lobpcg_value"] < -1e-4  # the noise's negative eigenvalues are found


def test_small_validation_bench_compares_every_version_and_ends_with_json():
    figures = bench_json("small_validation.py", "--cases", "300x100", "--rounds", "1")
    assert figures["bench"] == "small_validation" and figures["same_verdicts"]
    plain, bounded, noisy = figures["results"]
    assert plain["case"] == "300x100" and plain["verdict"] == "rank 100" and plain["rank_bound"] is None
    assert bounded["case"] == "300x100 bound" and bounded["verdict"] == "rank 100" and bounded["rank_bound"] == 100
    assert {"make_problem_speedup_vs_pivoted_first", "make_problem_speedup_vs_eigvalsh"} <= plain.keys()
    exact, _, asym = figures["symmetrise"]
    assert exact["case"] == "300x100" and exact["exactly_symmetric"] and not asym["exactly_symmetric"]
    assert noisy["case"] == "300x100+noise" and noisy["verdict"].startswith("refused: K is not positive semidefinite")


def test_admm_rho_bench_runs_every_variant_and_ends_with_json():
    figures = bench_json("admm_rho.py", "--sizes", "300", "--seeds", "0", "--gammas", "5e-4", "--repeat", "1")
    assert figures["bench"] == "admm_rho" and figures["cases"] == 1
    (row,) = figures["results"]
    assert set(row["iterations"]) == {"former", "polish", "default", "settle1", "settle2"}
    # here the first polish succeeds in every variant (7, 8, 9 iterations measured), so sooner means fewer
    assert row["iterations"]["settle1"] < row["iterations"]["settle2"] < row["iterations"]["default"]
    assert {"default_vs_settle1", "default_vs_settle2"} <= set(figures)


def test_sparse_chain_bench_runs_both_chains_and_ends_with_json():
    figures = bench_json("sparse_chain.py", "--cases", "200x1000", "--gammas", "2e-2", "--repeats", "1",
                         "--starts", "64", "128")
    assert figures["bench"] == "sparse_chain" and figures["cases"] == 2
    for row in figures["results"]:  # both chains certified on the Gram and the gradient operator
        assert row["kkt_former"] <= 1e-9 and row["kkt_now"] <= 1e-9
        assert row["solves_with_stop"] <= row["solves_without_stop"]
        assert set(row["start_s"]) == {"64", "128"}  # JSON keys
    assert {row["form"] for row in figures["results"]} == {"gram", "gradients"}
    assert figures["stop_cut_converging"] == 0


def test_rank_deficient_scan_times_both_orders_and_ends_with_json():
    figures = bench_json("rank_deficient.py", "--scan", "--scan-cases", "150x40", "--scan-ratios", "0.1", "0.01",
                         "--repeats", "1")
    assert figures["bench"] == "rank_deficient_scan" and len(figures["results"]) == 2
    assert all(r["homotopy_s"] > 0 and r["working_set_s"] > 0 and not r["rule_picks_working_set"]
               for r in figures["results"])  # N = 150 is below the rule's N


def test_blas_threads_bench_runs_and_ends_with_json():
    figures = bench_json("blas_threads.py", "--n", "200", "--repeats", "2")
    assert figures["bench"] == "blas_threads" and 0 < figures["support"] <= 200
    assert set(figures["solve_ms"]) == {"1t", "2t_spotrf"} and len(figures["spotrf_inside_solve_2t_ms"]) >= 2
    assert figures["profile_own_ms_per_solve_1t"]
    assert figures["calls_per_solve"]["products"] >= 1  # at least the certificate's
    assert set(figures["skeleton_ms"]) == {"solve", "skeleton"}


def test_floor_bench_counts_each_path_and_ends_with_json():
    figures = bench_json("floor.py", "--n", "400", "--p", "800", "--gamma", "2e-4", "--rounds", "2", "--repeat", "1")
    assert figures["bench"] == "floor" and figures["early_stop"] and 0 < figures["support"] <= 400
    exact, at_tol = figures["calls"]["exact"], figures["calls"]["tol"]
    assert exact["pairs_support"] >= 1 and at_tol["pairs_support"] == 0  # the early stop makes no polish
    assert at_tol["pairs_n"] > exact["pairs_n"] and exact["products"] >= 1 and at_tol["products"] >= 1
    versions = {"cvxpy", "exact", "exact_skeleton", "tol", "tol_skeleton"}
    assert set(figures["best_s"]) == versions and all(t > 0 for t in figures["best_s"].values())
    assert set(figures["per_round"]) == versions - {"cvxpy"} and all(len(r) == 2 for r in figures["per_round"].values())
    assert set(figures["ceiling"]) == set(figures["speedup"]) == {"exact", "tol"}
    sparse = subprocess.run([sys.executable, str(ROOT / "bench" / "floor.py"), "--n", "200", "--p", "400", "--gamma",
                             "5e-2"], capture_output=True, text=True, timeout=120)
    assert sparse.returncode == 2 and "skeleton models ADMM's path" in sparse.stderr  # pdas_direct: no such skeleton


def test_budget_form_bench_reads_the_budget_off_the_working_set_and_ends_with_json():
    figures = bench_json("budget_form.py", "--cases", "near:3000x1000:0.5", "clustered:2000x2100:1",
                         "clustered:3000x1000:3.87", "--forms", "gram")
    assert figures["bench"] == "budget_form" and figures["working_set_max"] > 0 and len(figures["cases"]) == 3
    # rank-deficient K past the full homotopy (the last one goes deeper after LARS stops a hair above its stopping
    # gamma), and a full-rank K of N = 2000
    for c in figures["cases"]:
        assert c["strategy_now"] == "working_set_homotopy" and c["strategy_before"] == "gamma_grid"
        assert c["kkt"] <= 1e-6 and c["active"] > 0


def test_gradient_form_bench_in_the_budget_form_forms_the_gram_at_a_dense_budget():
    figures = bench_json("gradient_form.py", "--cases", "clustered:200x300", "--budgets", "4", "--rounds", "1")
    assert figures["bench"] == "gradient_form" and figures["form"] == "budget"
    (c,) = figures["cases"]
    assert c["budget"] == 4 and c["gram_formed"] and c["same_support"] and c["kkt"] <= 1e-6
