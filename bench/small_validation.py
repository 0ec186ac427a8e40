"""Validation of K up to N = 3000 (make_problem), as it now runs and as it ran before, in one process.

Now: a pivoted Cholesky certifies PSD-ness and gives the rank first, and a dense eigvalsh runs only where it does
not certify K (an indefinite K: the error message's exact lambda_min). Before: eigvalsh always. Clustered synthetic
unit-norm gradients (bench/synthetic.py), K = G G^T in float64 as engine/gram.py forms it; full-rank (p > N) and
rank-deficient (p < N) cases, and one indefinite K (the first rank-deficient one plus symmetric noise), which both
versions refuse. Interleaved rounds time the spectrum check alone and the whole make_problem with each; prints the best
times (medians in brackets) with their ratios, checks that both give the same rank and verdict, and ends with one
JSON line.

    .venv/bin/python bench/small_validation.py [--cases 1000x4096 1000x300 3000x4096 3000x1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

# the repository root first (bench/solvers.py is named like the package), bench/ last
sys.path[0] = str(Path(__file__).resolve().parents[1])
sys.path.append(str(Path(__file__).resolve().parent))

from synthetic import case, clustered_gram  # noqa: E402
from timing import timed  # noqa: E402

import solvers.problem as problem_module  # noqa: E402
from solvers import KMMInputError, make_problem  # noqa: E402

NOW = problem_module._spectrum_facts


def former_spectrum_facts(K: np.ndarray, tol: float, rank_bound: int | None = None) -> tuple[float, int | None]:
    """The former check up to N = EIGVALSH_MAX_N: a dense eigvalsh, whose spectrum gives lambda_min and the rank."""
    if K.shape[0] > problem_module.EIGVALSH_MAX_N:
        raise ValueError("the former eigvalsh branch ran up to N = EIGVALSH_MAX_N only")
    return problem_module.eigen_facts(K)


def outcome(K: np.ndarray, beta: np.ndarray, facts) -> tuple[float, str]:
    """(seconds, 'rank R' or the refusal) of make_problem with `facts` as its spectrum check."""
    problem_module._spectrum_facts = facts
    try:
        t0 = time.perf_counter()
        try:
            verdict = f"rank {make_problem(K, beta, gamma=5e-4).rank}"
        except KMMInputError as exc:
            verdict = "refused: " + str(exc).split(" (tolerance")[0]
        return time.perf_counter() - t0, verdict
    finally:
        problem_module._spectrum_facts = NOW


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=case, nargs="+", default=[case(c) for c in
                                                               ("1000x4096", "1000x300", "3000x4096", "3000x1000")])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--noise", type=float, default=1e-4, help="entry scale of the indefinite case's symmetric noise")
    args = ap.parse_args()
    if any(n > problem_module.EIGVALSH_MAX_N for n, _ in args.cases):
        ap.error(f"this bench compares the branches up to N = {problem_module.EIGVALSH_MAX_N}")

    problems = []
    for n, p in args.cases:
        K, beta, _, _ = clustered_gram(n, p)
        problems.append((f"{n}x{p}", K, beta))
    # the noise turns a rank-deficient K's zero eigenvalues into a cluster of about +-noise sqrt(N): indefinite
    deficient = [i for i, (n, p) in enumerate(args.cases) if p < n]
    if deficient:
        name0, K0, beta0 = problems[deficient[0]]
        M = np.random.default_rng(1).standard_normal(K0.shape) * args.noise
        problems.append((f"{name0}+noise", K0 + 0.5 * (M + M.T), beta0))
        del M

    rows, same = [], True
    print(f"{'case':<15} {'check now':>18} {'check before':>18} {'ratio':>6}   {'make_problem now':>18} "
          f"{'before':>18} {'ratio':>6}  verdict")
    for name, K, beta in problems:
        tol = 1e-6 * float(np.abs(K).max())
        t = {"check_now": [], "check_before": [], "make_now": [], "make_before": []}
        verdicts = set()
        for _ in range(args.rounds):
            t["check_now"].append(timed(NOW, K, tol)[0])
            t["check_before"].append(timed(former_spectrum_facts, K, tol)[0])
            s, v_now = outcome(K, beta, NOW)
            t["make_now"].append(s)
            s, v_before = outcome(K, beta, former_spectrum_facts)
            t["make_before"].append(s)
            verdicts |= {v_now, v_before}
        same &= len(verdicts) == 1
        best = {k: min(v) for k, v in t.items()}
        med = {k: float(np.median(v)) for k, v in t.items()}
        rec = {"case": name, "verdict": " | ".join(sorted(verdicts))}
        rec |= {f"{k}_s": round(v, 4) for k, v in best.items()} | {f"{k}_median_s": round(v, 4) for k, v in med.items()}
        rec |= {"check_speedup": round(best["check_before"] / best["check_now"], 2),
                "make_problem_speedup": round(best["make_before"] / best["make_now"], 2)}
        rows.append(rec)

        ms = {k: f"{1e3 * best[k]:.1f} ({1e3 * med[k]:.1f}) ms" for k in best}
        print(f"{name:<15} {ms['check_now']:>18} {ms['check_before']:>18} {rec['check_speedup']:>5}x   "
              f"{ms['make_now']:>18} {ms['make_before']:>18} {rec['make_problem_speedup']:>5}x  {rec['verdict']}",
              flush=True)
    if not same:
        print("the two checks DISAGREE on a verdict", file=sys.stderr)
    print(json.dumps({"bench": "small_validation", "rounds": args.rounds, "same_verdicts": same, "results": rows}))
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
