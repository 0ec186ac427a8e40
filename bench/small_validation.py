"""Validation of K up to N = 3000 (make_problem) as it runs now and as it ran before, in one process.

Now: an unpivoted Cholesky certifies a K that may have full rank (no caller's rank bound below N); where it does
not, a pivoted Cholesky certifies PSD-ness and gives the rank; a dense eigvalsh runs only where neither certifies K
(an indefinite K: the error message's exact lambda_min). Before: the pivoted Cholesky first (4baa8e8 to 450f003),
and eigvalsh alone (before 4baa8e8). Clustered synthetic unit-norm gradients (bench/synthetic.py), K = G G^T in
float64 as engine/gram.py forms it; full-rank (p > N) and rank-deficient (p < N) cases, the latter without a rank
bound (the unpivoted attempt fails and is paid for) and with the bound p the pipeline passes (it is skipped), and
one indefinite K (the first rank-deficient one plus symmetric noise), which every version refuses. Interleaved
rounds (each started by the next version in turn) time the spectrum check alone and the whole make_problem with each version; prints the best times (medians
in brackets) with now's speed-up against each former version, checks that all give the same rank and verdict, and
ends with one JSON line.

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

import solvers.problem as problem_module  # noqa: E402
from solvers import KMMInputError, make_problem  # noqa: E402


def eigvalsh_facts(K: np.ndarray, tol: float, rank_bound: int | None = None) -> tuple[float, int | None]:
    """The check before 4baa8e8 up to N = EIGVALSH_MAX_N: a dense eigvalsh, whose spectrum gives lambda_min and the rank."""
    if K.shape[0] > problem_module.EIGVALSH_MAX_N:
        raise ValueError("the eigvalsh-only check ran up to N = EIGVALSH_MAX_N only")
    return problem_module.eigen_facts(K)


#: each version as the solvers.problem attributes it swaps in (bench-only; restored after every call)
VERSIONS = {
    "now": {},
    "pivoted_first": {"_plain_facts": lambda K: None},
    "eigvalsh": {"_spectrum_facts": eigvalsh_facts},
}


@contextmanager
def version(name: str):
    """solvers.problem as it ran in version `name`, for the duration of the block."""
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

    problems = []  # (name, K, beta, rank bound)
    for n, p in args.cases:
        K, beta, _, _ = clustered_gram(n, p)
        problems.append((f"{n}x{p}", K, beta, None))
        if p < n:
            problems.append((f"{n}x{p} bound", K, beta, p))
    # the noise turns a rank-deficient K's zero eigenvalues into a cluster of about +-noise sqrt(N): indefinite
    deficient = [i for i, (name, _, _, bound) in enumerate(problems) if bound is None and
                 case(name)[1] < case(name)[0]]
    if deficient:
        name0, K0, beta0, _ = problems[deficient[0]]
        M = np.random.default_rng(1).standard_normal(K0.shape) * args.noise
        problems.append((f"{name0}+noise", K0 + 0.5 * (M + M.T), beta0, None))
        del M

    warm = np.random.default_rng(0).standard_normal((8, 4))
    for v in VERSIONS:  # imports and first-call costs out of the timings
        outcome(v, warm @ warm.T, warm @ warm[0], None)
    rows, same = [], True
    print(f"{'case':<16} {'check now':>16} {'pivoted 1st':>16} {'eigvalsh':>16}   {'make_problem now':>16} "
          f"{'pivoted 1st':>16} {'eigvalsh':>16}  {'x piv':>6} {'x eig':>6}  verdict")
    for name, K, beta, bound in problems:
        tol = 1e-6 * float(np.abs(K).max())
        t = {f"{kind}_{v}": [] for kind in ("check", "make") for v in VERSIONS}
        verdicts = set()
        names = list(VERSIONS)
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
    if not same:
        print("the versions DISAGREE on a verdict", file=sys.stderr)
    print(json.dumps({"bench": "small_validation", "rounds": args.rounds, "same_verdicts": same, "results": rows}))
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
