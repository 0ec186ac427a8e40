"""The maintained solver benches still run and end with their JSON line (tiny sizes; no timing asserted)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
from run_helpers import ROOT, bench_json

pytestmark = pytest.mark.bench  # runs the solver bench scripts: `make bench-check`, not `make test`


def test_solver_bench_runs_and_ends_with_json():
    figures = bench_json("solvers.py", "--sizes", "30", "--p", "64")
    assert figures["bench"] == "solvers" and len(figures["results"]) == 2
    for r in figures["results"]:
        assert r["convalue_kkt"] < 1e-6 and r["convalue_obj"] <= r["cvxpy_obj"] + 1e-6
        assert r["validate_s"] > 0 and r["speedup_end_to_end_vs_cvxpy"] <= r["speedup_vs_cvxpy"]
        # the second row, at the accuracy: certified at tol, no worse than the reference
        assert r["tol"] == 1e-6 and r["convalue_tol_kkt"] <= 1e-6 and r["convalue_tol_obj"] <= r["cvxpy_obj"] + 1e-6
        assert r["speedup_tol_vs_cvxpy"] > 0


def test_floor_bench_counts_each_path_and_ends_with_json():
    """tol = 1e-4 makes ADMM's early stop certain on any BLAS (far above its float32 floor), so the tol skeleton
    has no support factor; the exact one polishes a support of 381, above mixed_min_n, by its float32 factor."""
    figures = bench_json("floor.py", "--n", "400", "--p", "800", "--gamma", "2e-4", "--tol", "1e-4", "--rounds", "2",
                         "--repeat", "1")
    assert figures["bench"] == "floor" and figures["early_stop"] and 0 < figures["support"] <= 400
    exact, at_tol = figures["calls"]["exact"], figures["calls"]["tol"]
    assert exact["pairs_support"] >= 1 and at_tol["pairs_support"] == 0  # the early stop makes no polish
    assert exact["pairs_n"] >= 1 and at_tol["pairs_n"] >= 1 and exact["products"] >= 1 and at_tol["products"] >= 1
    versions = {"cvxpy", "exact", "exact_skeleton", "tol", "tol_skeleton"}
    assert set(figures["best_s"]) == versions and all(t > 0 for t in figures["best_s"].values())
    assert set(figures["per_round"]) == versions - {"cvxpy"} and all(len(r) == 2 for r in figures["per_round"].values())
    assert set(figures["ceiling"]) == set(figures["speedup"]) == {"exact", "tol"}
    # a sparse gamma's plan reaches ADMM only after PDAS: the skeleton does not model it
    sparse = subprocess.run([sys.executable, str(ROOT / "bench" / "floor.py"), "--n", "200", "--p", "400", "--gamma",
                             "5e-2"], capture_output=True, text=True, timeout=120)
    assert sparse.returncode == 2 and "skeleton models ADMM's path" in sparse.stderr


def test_synthetic_gradients_have_the_same_dtypes_under_any_numpy_promotion_rules():
    """numpy 1.26 kept the float32 draws float32 where numpy 2 promoted them: the benches' data differed."""
    spec = importlib.util.spec_from_file_location("bench_synthetic", ROOT / "bench" / "synthetic.py")
    synthetic = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(synthetic)
    G, g_tar = synthetic.clustered_gradients(60, 32, seed=3)
    assert G.dtype == np.float64 and g_tar.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(G, axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(g_tar.astype(np.float64)), 1.0, rtol=1e-6)
    again, _ = synthetic.clustered_gradients(60, 32, seed=3)  # one seed, one problem: benches time methods on it
    assert np.array_equal(G, again)


def test_lasso_scale_bench_checks_every_answer_by_convalues_kkt_and_ends_with_json():
    """Tiny sizes: each library in a child process, checked by convalue's KKT function; the validation timing's facts
    (skglm and celer are bench-only: not asked for here, so the test runs without them)."""
    figures = bench_json("lasso_scale.py", "--sizes", "400", "--p", "48", "--ratios", "0.05", "0.005",
                         "--libraries", "convalue", "sklearn", "--max-seconds", "120", "--validation")
    assert figures["bench"] == "lasso_scale" and figures["p"] == 48 and len(figures["results"]) == 4
    for r in figures["results"]:
        assert "error" not in r and r["peak_rss_gib"] >= r["data_rss_gib"] > 0 and r["seconds"] >= 0
        assert r["kkt"] <= (1e-10 if r["library"] == "convalue" else figures["kkt_target"]) and r["reached"]
    for ratio in (0.05, 0.005):
        cv, sk = (next(r for r in figures["results"] if r["ratio"] == ratio and r["library"] == lib)
                  for lib in ("convalue", "sklearn"))
        assert cv["objective"] <= sk["objective"] + 1e-9 and f"400@{ratio:g}:sklearn" in figures["ratios"]
    (v,) = figures["validation"]
    assert v["formed"]["checks"]["spectral"] is False and v["spectral"]["checks"]["spectral"] is True
    assert v["formed"]["rank"] == v["spectral"]["rank"] == 48


def test_end_to_end_bench_certifies_every_version_and_ends_with_json():
    """Tiny sizes: every version runs interleaved, both convalue answers are certified and match CVXPY's objective
    (the bench asserts it), and the formed K skips the spectral check."""
    figures = bench_json("end_to_end.py", "--n", "60", "--p", "80", "--rounds", "2", "--repeat", "1")
    assert figures["bench"] == "end_to_end" and len(figures["results"]) == 2
    for r in figures["results"]:
        assert r["kkt"] <= 1e-10 and r["checks"]["psd"] == "formed" and r["checks"]["spectral"] is False
        assert set(r["best_s"]) == {"convalue", "validate", "solve", "convalue_outside", "cvxpy", "enet_path"}
        assert all(t > 0 for t in r["best_s"].values()) and r["vs_cvxpy"] > 0 and r["vs_enet_path"] > 0
