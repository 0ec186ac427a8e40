"""Validation of K up to N = 3000 (make_problem) as it runs now and as it ran before, in one process.

Now: an unpivoted Cholesky certifies a K that may have full rank (no caller's rank bound below N); where it does
not, a pivoted Cholesky certifies PSD-ness and gives the rank; a dense eigvalsh runs only where neither certifies K
(an indefinite K: the error message's exact lambda_min). Before: the pivoted Cholesky first (4baa8e8 to 450f003),
and eigvalsh alone (before 4baa8e8). Clustered synthetic unit-norm gradients (bench/synthetic.py), K = G G^T in
float64 as engine/gram.py forms it; full-rank (p > N) and rank-deficient (p < N) cases, the latter without a rank
bound (the unpivoted attempt fails and is paid for) and with the bound p the pipeline passes (it is skipped), and
one indefinite K (the first rank-deficient one plus symmetric noise), which every version refuses. Interleaved
rounds (each started by the next version in turn) time the spectrum check alone and the whole make_problem with each version; prints the best times (medians
in brackets) with now's speed-up against each former version, checks that all give the same rank and verdict.
Then symmetrising each K (exactly symmetric, as numpy's G @ G.T is) and the first one plus asymmetric round-off of
1e-12 now, where an exactly symmetric tile pair is copied as it is, against before (the same result, checked). Ends
with one JSON line.

    .venv/bin/python bench/small_validation.py [--cases 1000x4096 1000x300 3000x4096 3000x1000] [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

# the repository root first (bench/solvers.py is named like the package), bench/ last
sys.path[0] = str(Path(__file__).resolve().parents[1])
sys.path.append(str(Path(__file__).resolve().parent))

from synthetic import case, clustered_gram  # noqa: E402
from timing import timed  # noqa: E402

import convalue.solvers.problem as problem_module  # noqa: E402
from convalue.solvers import KMMInputError, make_problem  # noqa: E402


def eigvalsh_facts(K: np.ndarray, tol: float, rank_bound: int | None = None) -> tuple[float, int | None]:
    """The check before 4baa8e8 up to N = EIGVALSH_MAX_N: a dense eigvalsh, whose spectrum gives lambda_min and the rank."""
    if K.shape[0] > problem_module.EIGVALSH_MAX_N:
        raise ValueError("the eigvalsh-only check ran up to N = EIGVALSH_MAX_N only")
    return problem_module.eigen_facts(K)


#: each version as the convalue.solvers.problem attributes it swaps in (bench-only; restored after every call)
VERSIONS = {
    "now": {},
    "pivoted_first": {"_plain_facts": lambda K, floor: None},
    "eigvalsh": {"_spectrum_facts": eigvalsh_facts},
}


def former_symmetrised(K: np.ndarray, sym_tol: float) -> tuple[np.ndarray, float]:
    """convalue.solvers.problem.symmetrised before it copied exactly symmetric tile pairs as they are (the baseline)."""
    n, b = K.shape[0], problem_module.SYMMETRISE_TILE
    out = np.empty_like(K)
    scale, asym = 1e-300, 0.0
    for i in range(0, n, b):
        for j in range(i, n, b):
            upper, lower_t, tile = K[i:i + b, j:j + b], K[j:j + b, i:i + b].T, out[i:i + b, j:j + b]
            scale = max(scale, float(upper.max()), -float(upper.min()), float(lower_t.max()), -float(lower_t.min()))
            np.subtract(upper, lower_t, out=tile)
            asym = max(asym, float(tile.max()), -float(tile.min()))
            np.add(upper, lower_t, out=tile)
            tile *= 0.5
            if j != i:
                out[j:j + b, i:i + b] = tile.T
    if asym > sym_tol * scale:
        raise KMMInputError(f"K is not symmetric: max |K - K^T| = {asym:.3g}")
    return out, scale


def symmetrise_row(name: str, K: np.ndarray, rounds: int) -> dict:
    """Symmetrising K now and before, interleaved (best and median of `rounds`); exits if the results differ."""
    fns = {"now": problem_module.symmetrised, "before": former_symmetrised}
    t, out = {"now": [], "before": []}, {}
    for r in range(rounds):
        for which in (("now", "before") if r % 2 == 0 else ("before", "now")):
            s, out[which] = timed(fns[which], K, 1e-6)
            t[which].append(s)
    if not (np.array_equal(out["now"][0], out["before"][0]) and out["now"][1] == out["before"][1]):
        sys.exit(f"{name}: symmetrised now and before DISAGREE")
    best = {k: min(v) for k, v in t.items()}
    return {"case": name, "exactly_symmetric": bool(np.array_equal(K, K.T)),
            "now_s": round(best["now"], 5), "before_s": round(best["before"], 5),
            "now_median_s": round(float(np.median(t["now"])), 5),
            "before_median_s": round(float(np.median(t["before"])), 5),
            "speedup": round(best["before"] / best["now"], 2)}


@contextmanager
def version(name: str):
    """convalue.solvers.problem as it ran in version `name`, for the duration of the block."""
    saved = {attr: getattr(problem_module, attr) for attr in VERSIONS[name]}
    for attr, value in VERSIONS[name].items():
        setattr(problem_module, attr, value)
    try:
        yield
    finally:
        for attr, value in saved.items():
            setattr(problem_module, attr, value)


def check(name: str, K: np.ndarray, tol: float, bound: int | None) -> float:
    """Seconds of version `name`'s spectrum check alone."""
    with version(name):
        return timed(problem_module._spectrum_facts, K, tol, bound)[0]


def outcome(name: str, K: np.ndarray, beta: np.ndarray, bound: int | None) -> tuple[float, str]:
    """(seconds, 'rank R' or the refusal) of make_problem in version `name`."""
    with version(name):
        t0 = time.perf_counter()
        try:
            verdict = f"rank {make_problem(K, beta, gamma=5e-4, rank_bound=bound).rank}"
        except KMMInputError as exc:
            verdict = "refused: " + str(exc).split(" (tolerance")[0]
        return time.perf_counter() - t0, verdict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=case, nargs="+", default=[case(c) for c in
                                                               ("1000x4096", "1000x300", "3000x4096", "3000x1000")])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--noise", type=float, default=1e-4, help="entry scale of the indefinite case's symmetric noise")
    args = ap.parse_args()
    if any(n > problem_module.EIGVALSH_MAX_N for n, _ in args.cases):
        ap.error(f"this bench compares the versions up to N = {problem_module.EIGVALSH_MAX_N}")

    problems, deficient = [], None  # (name, K, beta, rank bound); the first rank-deficient case
    for n, p in args.cases:
        K, beta, _, _ = clustered_gram(n, p)
        problems.append((f"{n}x{p}", K, beta, None))
        if p < n:
            problems.append((f"{n}x{p} bound", K, beta, p))
            deficient = deficient or problems[-2]
    # the noise turns a rank-deficient K's zero eigenvalues into a cluster of about +-noise sqrt(N): indefinite
    if deficient:
        name0, K0, beta0, _ = deficient
        M = np.random.default_rng(1).standard_normal(K0.shape) * args.noise
        problems.append((f"{name0}+noise", K0 + 0.5 * (M + M.T), beta0, None))
        del M

    warm = np.random.default_rng(0).standard_normal((8, 4))
    for v in VERSIONS:  # imports and first-call costs out of the timings
        outcome(v, warm @ warm.T, warm @ warm[0], None)
    rows, same, names = [], True, list(VERSIONS)
    print(f"{'case':<16} {'check now':>16} {'pivoted 1st':>16} {'eigvalsh':>16}   {'make_problem now':>16} "
          f"{'pivoted 1st':>16} {'eigvalsh':>16}  {'x piv':>6} {'x eig':>6}  verdict")
    for name, K, beta, bound in problems:
        tol = 1e-6 * float(np.abs(K).max())
        t = {f"{kind}_{v}": [] for kind in ("check", "make") for v in VERSIONS}
        verdicts = set()
        for r in range(args.rounds):
            for v in names[r % len(names):] + names[:r % len(names)]:  # each round starts with another version
                t[f"check_{v}"].append(check(v, K, tol, bound))
                s, verdict = outcome(v, K, beta, bound)
                t[f"make_{v}"].append(s)
                verdicts.add(verdict)
        same &= len(verdicts) == 1
        best = {k: min(v) for k, v in t.items()}
        med = {k: float(np.median(v)) for k, v in t.items()}
        rec = {"case": name, "rank_bound": bound, "verdict": " | ".join(sorted(verdicts))}
        rec |= {f"{k}_s": round(v, 4) for k, v in best.items()} | {f"{k}_median_s": round(v, 4) for k, v in med.items()}
        for v in ("pivoted_first", "eigvalsh"):
            rec[f"check_speedup_vs_{v}"] = round(best[f"check_{v}"] / best["check_now"], 2)
            rec[f"make_problem_speedup_vs_{v}"] = round(best[f"make_{v}"] / best["make_now"], 2)
        rows.append(rec)

        ms = {k: f"{1e3 * best[k]:.1f} ({1e3 * med[k]:.1f})" for k in best}
        print(f"{name:<16} {ms['check_now']:>16} {ms['check_pivoted_first']:>16} {ms['check_eigvalsh']:>16}   "
              f"{ms['make_now']:>16} {ms['make_pivoted_first']:>16} {ms['make_eigvalsh']:>16}  "
              f"{rec['make_problem_speedup_vs_pivoted_first']:>5}x {rec['make_problem_speedup_vs_eigvalsh']:>5}x  "
              f"{rec['verdict']}", flush=True)
    print("(ms: best, median in brackets; x piv / x eig: make_problem now against each former version)")
    print(f"\n{'symmetrise':<16} {'exact':>6} {'now':>16} {'before':>16} {'ratio':>6}")
    sym_cases = [(name, K) for name, K, _, bound in problems if bound is None]  # a bound row repeats its K
    name0, K0 = sym_cases[0]
    # round-off asymmetry far inside the tolerance: every tile pair takes the symmetrising branch, as before
    sym_cases.append((f"{name0}+asym", K0 + 1e-12 * np.random.default_rng(2).standard_normal(K0.shape)))
    sym_rows = []
    for name, K in sym_cases:
        row = symmetrise_row(name, K, args.rounds)
        sym_rows.append(row)
        print(f"{name:<16} {str(row['exactly_symmetric']):>6} "
              f"{1e3 * row['now_s']:>7.1f} ({1e3 * row['now_median_s']:.1f}) "
              f"{1e3 * row['before_s']:>7.1f} ({1e3 * row['before_median_s']:.1f}) {row['speedup']:>5}x", flush=True)
    if not same:
        print("the versions DISAGREE on a verdict", file=sys.stderr)
    print(json.dumps({"bench": "small_validation", "rounds": args.rounds, "same_verdicts": same, "results": rows,
                      "symmetrise": sym_rows}))
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
