"""The dense KMM solve (ADMM + polish) against its former settings, in one process.

Variants: `former` (fixed rho = 0.3 relative to mean K_ii; the polish runs the PDAS rule on the ADMM
iterate), `polish` (fixed rho, the polish solves on the iterate's support and signs first), `default`
(that polish, rho in proportion to gamma / max|beta|, polished once the support and signs have held for
three iterations) and `settle1`, `settle2` (the default, polished after one or two). Clustered synthetic
unit-norm gradients (bench/synthetic.py, p = 4096), N in {300, 1000, 2000}, three seeds, gamma in
{2e-4, 5e-4, 2e-3, 5e-3}: every case where the solver takes the ADMM path. For each case and variant: the solver's iteration count
(deterministic) and the best of --repeat interleaved timed solves; prints the table, iteration wins and
geometric-mean time ratios, and ends with one JSON line.

    .venv/bin/python bench/admm_rho.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.synthetic import clustered_gram  # noqa: E402
from convalue.solvers import admm, make_problem, solve_problem  # noqa: E402
from convalue.solvers.active_set import pdas_plain  # noqa: E402

DEFAULT = {"admm_rho": admm.admm_rho, "polish_on_support": admm.polish_on_support, "admm_polish": admm.admm_polish}


def _former_polish(op, gamma: float, z: np.ndarray, scale: float):
    return pdas_plain(op, gamma, z, 3, scale)  # the PDAS rule straight on the inexact iterate


VARIANTS = {
    "former": DEFAULT | {"admm_rho": lambda gamma, gmax: 0.3, "polish_on_support": _former_polish},
    "polish": DEFAULT | {"admm_rho": lambda gamma, gmax: 0.3},
    "default": DEFAULT,
    "settle1": DEFAULT | {"admm_polish": functools.partial(DEFAULT["admm_polish"], settle=1)},
    "settle2": DEFAULT | {"admm_polish": functools.partial(DEFAULT["admm_polish"], settle=2)},
}


def _use(variant: dict) -> None:
    """Put a variant's functions in convalue.solvers.admm, where solve_penalised and admm_polish look them up."""
    for name, fn in variant.items():
        setattr(admm, name, fn)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[300, 1000, 2000])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--gammas", type=float, nargs="+", default=[2e-4, 5e-4, 2e-3, 5e-3])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    rows = []
    print(f"{'N':>5} {'seed':>4} {'gamma':>7} {'nnz':>5}  " + "  ".join(f"{'it ' + v:>10}" for v in VARIANTS)
          + "  " + "  ".join(f"{'ms ' + v:>10}" for v in VARIANTS))
    for n in args.sizes:
        for seed in args.seeds:
            K, beta, _, _ = clustered_gram(n, seed=seed)
            for gamma in args.gammas:
                prob = make_problem(K, beta, gamma=gamma, check_psd=False)
                best = {v: np.inf for v in VARIANTS}
                out = {}
                for _ in range(args.repeat):  # interleaved: the host's drift hits every variant alike
                    for name, variant in VARIANTS.items():
                        _use(variant)
                        t0 = time.perf_counter()
                        out[name] = solve_problem(prob)
                        best[name] = min(best[name], time.perf_counter() - t0)
                _use(DEFAULT)
                if out["default"].info["strategy"] != "admm_polish":
                    continue  # a sparse solution: PDAS, no ADMM
                ref = out["former"].objective
                assert all(abs(o.objective - ref) <= 1e-9 * max(1.0, abs(ref)) for o in out.values())
                row = {"N": n, "seed": seed, "gamma": gamma, "nnz": int(np.count_nonzero(out["default"].w)),
                       "iterations": {v: int(out[v].iterations) for v in VARIANTS},
                       "ms": {v: round(best[v] * 1e3, 2) for v in VARIANTS}}
                rows.append(row)
                print(f"{n:>5} {seed:>4} {gamma:>7.0e} {row['nnz']:>5}  "
                      + "  ".join(f"{row['iterations'][v]:>10}" for v in VARIANTS) + "  "
                      + "  ".join(f"{row['ms'][v]:>10.2f}" for v in VARIANTS), flush=True)

    def compare(a: str, b: str) -> dict:
        its = [(r["iterations"][a], r["iterations"][b]) for r in rows]
        ratio = float(np.exp(np.mean([np.log(r["ms"][a] / r["ms"][b]) for r in rows])))
        return {"fewer_iterations": sum(y < x for x, y in its), "same_iterations": sum(y == x for x, y in its),
                "more_iterations": sum(y > x for x, y in its), "speedup_geomean": round(ratio, 3)}

    summary = {"polish_vs_former": compare("former", "polish"), "rho_rule_vs_fixed": compare("polish", "default"),
               "default_vs_former": compare("former", "default"),
               "default_vs_settle1": compare("settle1", "default"), "default_vs_settle2": compare("settle2", "default")}
    for name, c in summary.items():
        print(f"{name:18s}: iterations fewer in {c['fewer_iterations']}, the same in {c['same_iterations']}, more in "
              f"{c['more_iterations']} of {len(rows)} ADMM cases; {c['speedup_geomean']:.2f}x faster "
              f"(geometric mean, best of {args.repeat})")
    print(json.dumps({"bench": "admm_rho", "cases": len(rows), **summary, "results": rows}))


if __name__ == "__main__":
    main()
