"""When does selection pay? KMM's top-k against the target alone, One-Step (cosine) and random, over target sizes
and step budgets, paired by seed (the paper's premise: a small, precious target).

Each target size is one run folder of CONFIG (default the demo: Marathi against 27 chatterbot languages) with
data.target_train_size set (0: the whole train split); each step budget is a `convalue.run` of it with
finetune.steps, finetune.repeats seeds, finetune.ks [k] and baselines [target_only, cosine, random] set, so the
candidates' vectors are computed once per size and every fine-tune is stored. KMM's loss minus each other
method's comes from summary.json's evaluation.kmm_minus: the mean over seeds, its paired 95 % t-interval and in how
many seeds KMM was lower. This measures quality, not speed: the baseline it compares against is the target
alone, trained in the same run. Prints one line per regime and method, then one JSON line.

    .venv/bin/python bench/selection_pays.py [--sizes 8 0] [--steps 24 72] [--repeats 3] [--k 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import convalue

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("target_only", "cosine", "random")


def regime(config: str, size: int, steps: int, repeats: int, k: int, out: str) -> dict:
    """One regime's run: its target size, the KMM-minus rows and the cells' mean losses."""
    overrides = [f"name=selection-pays-n{size or 'all'}", f"out={out}", f"finetune.steps={steps}",
                 f"finetune.repeats={repeats}", f"finetune.ks=[{k}]", f"finetune.baselines=[{','.join(METHODS)}]",
                 "finetune.enabled=true", "bootstrap.samples=0"]
    if size:
        overrides.append(f"data.target_train_size={size}")
    cfg = convalue.load_config(config, overrides)
    t0 = time.perf_counter()
    summary = convalue.run(cfg)
    if summary.status != "complete":
        raise SystemExit(f"regime size={size} steps={steps}: run ended {summary.status}: {summary.error}")
    ev = summary.evaluation
    cells: dict[str, list[float]] = {}
    for r in summary.finetune:
        cells.setdefault(r["method"], []).append(r["val_loss"])
    return {"target_train": summary.data["target_train"], "steps": steps, "k": k, "seeds": ev["seeds"],
            "selected": summary.selected, "kmm_minus": [d for d in ev["kmm_minus"] if d["k"] == k],
            "mean_val_loss": {m: sum(v) / len(v) for m, v in cells.items()},
            "base_val_loss": ev["base_val_loss"], "seconds": round(time.perf_counter() - t0, 1)}


def verdict(d: dict) -> str:
    """pays / costs / unresolved, from the interval of KMM's loss minus the other's."""
    ci = d.get("ci95")
    if ci is None:
        return "one seed"
    return "KMM lower" if ci[1] < 0 else "KMM higher" if ci[0] > 0 else "unresolved"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "demo.yaml"))
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 0],
                    help="target train sizes (0: the whole split; default 8 0)")
    ap.add_argument("--steps", type=int, nargs="+", default=[24, 72], help="step budgets (default 24 72)")
    ap.add_argument("--repeats", type=int, default=3, help="seeds per cell (default 3)")
    ap.add_argument("--k", type=int, default=3, help="the budget k of every method (default 3)")
    ap.add_argument("--out", default=str(ROOT / "runs"), help="runs folder (default runs/)")
    args = ap.parse_args()
    logging.getLogger("convalue").setLevel(logging.WARNING)
    results = []
    for size in args.sizes:
        for steps in args.steps:
            r = regime(args.config, size, steps, args.repeats, args.k, args.out)
            results.append(r)
            losses = ", ".join(f"{m} {v:.4f}" for m, v in r["mean_val_loss"].items())
            print(f"target {r['target_train']} examples, {steps} steps, k={args.k}, {len(r['seeds'])} seeds "
                  f"({r['seconds']:.0f} s): mean loss {losses}; base {r['base_val_loss']:.4f}", flush=True)
            for d in r["kmm_minus"]:
                ci = d.get("ci95")
                ci_text = "" if ci is None else f" [95% CI {ci[0]:+.4f}, {ci[1]:+.4f}]"
                print(f"  KMM minus {d['method']}: {d['mean']:+.4f}{ci_text}, KMM lower in {d['reference_lower']} "
                      f"of {d['seeds']}: {verdict(d)}", flush=True)
    pays = [{"target_train": r["target_train"], "steps": r["steps"],
             **{d["method"]: verdict(d) for d in r["kmm_minus"]}} for r in results]
    print(json.dumps({"bench": "selection_pays", "k": args.k, "repeats": args.repeats, "regimes": pays,
                      "results": results}))


if __name__ == "__main__":
    main()
