"""The dense regime at scale: convalue's gradient-space solve against skglm, celer and scikit-learn's Lasso.

KMM's penalised form min_w 0.5 w'Kw - beta'w + gamma ||w||_1 with K = G G^T and beta = G g_tar is the Lasso with
X = G^T (p samples, N features), y = g_tar and scikit-learn's alpha = gamma / p. On the clustered synthetic unit-norm
gradients of bench/synthetic.py (p = 8192), for every N and both gammas (5e-2 max|beta|, sparse, and the dense one:
1e-3 max|beta| below N = 100,000 and 5e-4 from it, the issue's targets), each library solves in a child process of
its own (so that peak resident memory does not mix between cases; the data are generated once and loaded there):

- convalue: solve_kmm_gradients, exact (certified at 1e-10 relative);
- skglm's Lasso (working sets, Anderson-accelerated coordinate descent): tol is its largest KKT violation in its
  units (the gradient over p), set to --kkt max(1, max|beta|) / p;
- celer's Lasso (working sets, dual extrapolation) and scikit-learn's Lasso (cyclic coordinate descent): tol bounds
  the duality gap by tol ||y||^2 (in the objective's unscaled units), set to (--kkt max(1, max|beta|))^2 / (2 ||y||^2)
  (a gap g bounds every inactive candidate's KKT violation by sqrt(2 g) for unit-norm rows).
- convalue_before (on request): convalue without the reduced-Gram working set, the dense head before it.

Every answer is checked by convalue's own KKT function on the gradient operator (convalue.solvers.active_set.kkt_of),
relative to max(1, max|beta|), with the objective from the same residual. Per case: wall seconds, CPU seconds, peak
RSS right after the solve and the RSS of the data alone, KKT, objective, nnz; then each library's time over
convalue's, and one JSON line. A case past --max-seconds is stopped and reported as such.

    .venv/bin/python bench/lasso_scale.py                          # N = 10,000 and 30,000 (tens of minutes)
    .venv/bin/python bench/lasso_scale.py --large                  # and N = 100,000 (hours, 7-8 GB per case)
    .venv/bin/python bench/lasso_scale.py --sizes 30000 --libraries convalue skglm --ratios 1e-3
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

LIBRARIES = ("convalue", "skglm", "celer", "sklearn")
#: convalue's dense head before the reduced-Gram working set (policy reduced.min_n = 0): the "before" of issue 43
BEFORE = "convalue_before"
GIB = 1024.0 ** 3


def dense_ratio(n: int) -> float:
    """The issue's dense gamma / max|beta|: 1e-3 below N = 100,000 (N = 30,000: ~4,800 active), 5e-4 from it."""
    return 1e-3 if n < 100_000 else 5e-4


def data_paths(data_dir: Path, n: int, p: int, seed: int) -> tuple[Path, Path]:
    return data_dir / f"G_{n}_{p}_{seed}.npy", data_dir / f"g_{n}_{p}_{seed}.npy"


def make_data(data_dir: Path, n: int, p: int, seed: int) -> None:
    """Generate the clustered gradients once (bench/synthetic.py, a chunk of rows at a time) and save them."""
    from synthetic import clustered_gradients

    G, g32 = clustered_gradients(n, p, seed=seed)
    gpath, tpath = data_paths(data_dir, n, p, seed)
    np.save(gpath, G)
    np.save(tpath, g32.astype(np.float64))


def peak_rss() -> float:
    """This process's peak resident memory so far, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


def cpu_seconds() -> float:
    """CPU seconds of this process and its threads (user and system)."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def solve(library: str, G: np.ndarray, g: np.ndarray, gamma: float, kkt_abs: float,
          max_epochs: int) -> tuple[np.ndarray, str]:
    """(w, a note) from one library at gamma; kkt_abs: the KKT violation (convalue's units) the libraries aim at."""
    p = G.shape[1]
    X = G.T  # Fortran-ordered view: no copy for the Lasso solvers
    alpha = gamma / p
    gap_tol = 0.5 * kkt_abs ** 2 / float(g @ g)
    if library in ("convalue", BEFORE):
        from convalue.solvers import DEFAULT_POLICY, solve_kmm_gradients

        policy = DEFAULT_POLICY.but(reduced={"min_n": 0}) if library == BEFORE else DEFAULT_POLICY
        sol = solve_kmm_gradients(G, g, gamma=gamma, policy=policy)
        return sol.w, f"{sol.info['step']}, {sol.iterations} iterations"
    if library == "skglm":
        from skglm import Lasso

        model = Lasso(alpha=alpha, fit_intercept=False, tol=kkt_abs / p, max_iter=1000, max_epochs=max_epochs)
    elif library == "celer":
        from celer import Lasso

        model = Lasso(alpha=alpha, fit_intercept=False, tol=gap_tol, max_iter=1000, max_epochs=max_epochs)
    elif library == "sklearn":
        from sklearn.linear_model import Lasso

        model = Lasso(alpha=alpha, fit_intercept=False, tol=gap_tol, max_iter=max_epochs, precompute=False)
    else:
        raise ValueError(f"unknown library {library!r}")
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(X, g)
    converged = not any("converge" in str(c.message).lower() for c in caught)
    return np.asarray(model.coef_, dtype=np.float64), "converged" if converged else "NOT converged (its own test)"


def warm_up(library: str) -> None:
    """Import the library and compile its kernels (numba, in skglm) on a tiny problem, out of the timing."""
    rng = np.random.default_rng(0)
    G = rng.standard_normal((40, 16))
    solve(library, G, rng.standard_normal(16), 0.01, 1e-6, 1000)


def child(spec: dict) -> dict:
    """One case in this process: load the data, warm the library up, solve, then check."""
    from convalue.solvers.active_set import kkt_of, residual
    from convalue.solvers.operators import GradientOperator
    from convalue.solvers.problem import objective_from_residual

    gpath, tpath = data_paths(Path(spec["data_dir"]), spec["n"], spec["p"], spec["seed"])
    warm_up(spec["library"])
    G, g = np.load(gpath), np.load(tpath)
    beta_max = float(np.abs(G @ g).max())
    gamma = spec["ratio"] * beta_max
    scale = max(1.0, beta_max)
    rss_data = peak_rss()
    t0, c0 = time.perf_counter(), cpu_seconds()
    w, note = solve(spec["library"], G, g, gamma, spec["kkt"] * scale, spec["max_epochs"])
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    rss = peak_rss()  # before the check below gathers rows of G
    op = GradientOperator(G, g)
    r = residual(op, w)
    kkt = kkt_of(op, gamma, w) / scale
    objective = objective_from_residual(w, r, op.beta, gamma * float(np.abs(w).sum()))
    version = None if spec["library"] in ("convalue", BEFORE) else importlib.metadata.version(
        "scikit-learn" if spec["library"] == "sklearn" else spec["library"])
    return {"N": spec["n"], "ratio": spec["ratio"], "library": spec["library"], "version": version,
            "seconds": round(seconds, 3),
            "cpu_seconds": round(cpu, 3), "peak_rss_gib": round(rss / GIB, 3), "data_rss_gib": round(rss_data / GIB, 3),
            "kkt": kkt, "objective": objective, "nnz": int(np.count_nonzero(w)), "reached": bool(kkt <= spec["kkt"]),
            "note": note}


def run_case(spec: dict, max_seconds: float) -> dict:
    """child(spec) in a process of its own, stopped past max_seconds."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    base = {"N": spec["n"], "ratio": spec["ratio"], "library": spec["library"]}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=max_seconds)
    except subprocess.TimeoutExpired:
        return base | {"error": f"stopped after {max_seconds:.0f} s"}
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        return base | {"error": f"exit {out.returncode}: {tail[0][:200]}"}
    return json.loads(lines[-1])


def validation_case(spec: dict) -> dict:
    """make_problem on K = G G^T formed here: the spectral check (rank_bound = p) against formed=True."""
    from convalue.solvers import make_problem

    gpath, tpath = data_paths(Path(spec["data_dir"]), spec["n"], spec["p"], spec["seed"])
    G, g = np.load(gpath), np.load(tpath)
    K, beta = G @ G.T, G @ g
    out = {"N": spec["n"]}
    for name, kw in (("formed", {"formed": True}), ("spectral", {})):
        t0 = time.perf_counter()
        prob = make_problem(K, beta, gamma=0.05 * float(np.abs(beta).max()), rank_bound=spec["p"], **kw)
        out[name] = {"seconds": round(time.perf_counter() - t0, 3), "checks": prob.checks, "rank": prob.rank}
    return out


def available(library: str) -> bool:
    if library in ("convalue", "sklearn", BEFORE):
        return True
    import importlib.util

    return importlib.util.find_spec(library) is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 30_000])
    ap.add_argument("--large", action="store_true", help="add N = 100,000 (each case 7-8 GB and minutes)")
    ap.add_argument("--ratios", type=float, nargs="+", default=None,
                    help="gamma / max|beta| (default: 5e-2 and the dense one of each N, see dense_ratio)")
    ap.add_argument("--libraries", nargs="+", default=list(LIBRARIES), choices=(*LIBRARIES, BEFORE),
                    help=f"{BEFORE}: convalue without the reduced-Gram working set (the code before it)")
    ap.add_argument("--validation", action="store_true",
                    help="also time make_problem on K = G G^T (N <= 10,000): formed=True against the spectral check")
    ap.add_argument("--p", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kkt", type=float, default=1e-6,
                    help="the KKT violation, relative to max(1, max|beta|), the libraries aim at (convalue is exact)")
    ap.add_argument("--max-seconds", type=float, default=1800.0, help="a case past this is stopped")
    ap.add_argument("--max-epochs", type=int, default=100_000, help="the libraries' epoch (or iteration) limit")
    ap.add_argument("--data-dir", type=Path, default=None, help="where the data are kept (default: a temporary one)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--make-data", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(validation_case(spec) if spec.get("validation") else child(spec), default=float))
        return
    if args.make_data:
        d, n, p, seed = args.make_data
        make_data(Path(d), int(n), int(p), int(seed))
        return

    sizes = args.sizes + ([100_000] if args.large and 100_000 not in args.sizes else [])
    libraries = [lib for lib in args.libraries if available(lib)]
    missing = sorted(set(args.libraries) - set(libraries))
    if missing:
        print(f"not installed, skipped: {', '.join(missing)} (.venv/bin/pip install -e '.[bench]')")
    tmp = None
    if args.data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="lasso_scale_")
        data_dir = Path(tmp.name)
    else:
        data_dir = args.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
    rows, validation = [], []
    print(f"{'N':>7} {'gamma':>7} {'library':<9} {'seconds':>9} {'cpu_s':>9} {'peak_GiB':>8} {'data_GiB':>8} "
          f"{'kkt':>9} {'objective':>17} {'nnz':>6}  note", flush=True)
    try:
        for n in sizes:
            if not data_paths(data_dir, n, args.p, args.seed)[0].exists():
                t0 = time.perf_counter()
                subprocess.run([sys.executable, str(Path(__file__).resolve()), "--make-data", str(data_dir), str(n),
                                str(args.p), str(args.seed)], check=True)
                print(f"# N = {n}: data generated in {time.perf_counter() - t0:.1f} s", flush=True)
            if args.validation and n <= 10_000:
                spec = {"n": n, "p": args.p, "seed": args.seed, "data_dir": str(data_dir), "validation": True}
                out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
                                     capture_output=True, text=True, check=True)
                v = json.loads(out.stdout.strip().splitlines()[-1])
                validation.append(v)
                print(f"# N = {n}: make_problem of K = G G^T in {v['spectral']['seconds']:.2f} s with the spectral "
                      f"check ({v['spectral']['checks']['psd']}), {v['formed']['seconds']:.2f} s with formed=True",
                      flush=True)
            for ratio in args.ratios or [5e-2, dense_ratio(n)]:
                for library in libraries:
                    spec = {"n": n, "p": args.p, "seed": args.seed, "ratio": ratio, "library": library,
                            "kkt": args.kkt, "max_epochs": args.max_epochs, "data_dir": str(data_dir)}
                    rec = run_case(spec, args.max_seconds)
                    rec["load"] = os.getloadavg()[0]
                    rows.append(rec)
                    if "error" in rec:
                        print(f"{n:>7} {ratio:>7.0e} {library:<9} {rec['error']}", flush=True)
                        continue
                    version = f" ({library} {rec['version']})" if rec.get("version") else ""
                    print(f"{n:>7} {ratio:>7.0e} {library:<9} {rec['seconds']:>9.2f} {rec['cpu_seconds']:>9.2f} "
                          f"{rec['peak_rss_gib']:>8.2f} {rec['data_rss_gib']:>8.2f} {rec['kkt']:>9.1e} "
                          f"{rec['objective']:>17.12f} {rec['nnz']:>6}  {rec['note']}{version}"
                          f"{'' if rec['reached'] else f' (KKT above {args.kkt:g})'}; load {rec['load']:.1f}",
                          flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()
    ratios = {}
    for rec in rows:
        base = next((r for r in rows if r["N"] == rec["N"] and r["ratio"] == rec["ratio"]
                     and r["library"] == "convalue" and "error" not in r), None)
        if rec["library"] == "convalue" or base is None or "error" in rec:
            continue
        key = f"{rec['N']}@{rec['ratio']:g}:{rec['library']}"
        ratios[key] = {"wall": round(rec["seconds"] / base["seconds"], 2),
                       "cpu": round(rec["cpu_seconds"] / max(base["cpu_seconds"], 1e-6), 2)}
        print(f"N = {rec['N']:>7}, gamma = {rec['ratio']:g} max|beta|: {rec['library']} takes "
              f"{ratios[key]['wall']}x convalue's time ({ratios[key]['cpu']}x its CPU time)")
    print(json.dumps({"bench": "lasso_scale", "p": args.p, "seed": args.seed, "kkt_target": args.kkt,
                      "results": rows, "ratios": ratios, "validation": validation}, default=float))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/synthetic.py
    main()
