"""When does selection pay? A regime map: KMM's top-k against the target alone, One-Step (cosine) and random, paired
by seed, over target size, step budget, pool, compute budget (fixed / additive) and the evaluation it is read on.

Each (pool, target size) is one run folder of CONFIG (default examples/paper/regime_japanese.yaml: a Japanese chat
target, 27 other languages, every fine-tune also measured on held-out Japanese topics), so the candidates' vectors
are computed once per folder and every fine-tune is stored (a rerun trains only what is new). Each cell is a
`convalue.run` with data.target_train_size (0: the whole split), finetune.steps, finetune.budget, finetune.repeats
seeds, finetune.ks [k] and baselines [target_only, cosine, random]. Every fine-tune is measured on every evaluation
of the config, so the evaluation axis costs nothing: each cell is read on each of --evals. KMM's loss minus each
other method's is paired by seed (each seed's draws are shared): the mean, its 95 % t-interval and in how many seeds
KMM was lower. Pools: `other` (the config's candidates) or `same` (those plus --same-topics, groups of the
target's language on other topics). Each finished cell is appended to --jsonl as one JSON line; `--table` prints
the markdown table of every cell in it (docs/paper-results.md's regime map) and exits.

    .venv/bin/python bench/selection_pays.py --sizes 8 --steps 24 --budgets additive fixed
    .venv/bin/python bench/selection_pays.py --table

`--eval-every N` keeps each cell's learning curves (finetune.eval_every) in its line: where the target alone and
KMM's selection are lowest under that step budget.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import convalue
from convalue.engine.protocol.measures import Measure
from convalue.engine.protocol.summaries import paired_differences
from convalue.engine.report.tables import curve_lines

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("target_only", "cosine", "random")
SAME_TOPICS = ("ai", "botprofile", "computers", "emotion", "gossip", "humor", "literature", "movies", "politics",
               "psychology", "science")


def pool_override(cfg_path: str, pool: str, language: str, topics: list[str]) -> list[str]:
    """The override that adds the target language's other topics to the candidates (pool `same`)."""
    if pool == "other":
        return []
    base = convalue.load_config(cfg_path).data.candidates
    if len(base) != 1 or base[0].kind != "chatterbot" or base[0].group_by != "language":
        raise SystemExit("--pools same needs a config whose candidates are one chatterbot source by language")
    exclude = ", ".join(base[0].exclude)
    include = ", ".join(f"{language}/{t}" for t in topics)
    return [f"data.candidates=[{{kind: chatterbot, group_by: language, exclude: [{exclude}]}}, "
            f"{{kind: chatterbot, group_by: language/topic, include: [{include}]}}]"]


def cell(config: str, pool: str, size: int, steps: int, budget: str, args) -> dict:
    """One cell's run: what KMM bought, each method's mean loss and KMM's paired differences, per evaluation."""
    stem = Path(config).stem
    overrides = [f"name=selection-pays-{stem}-{pool}-n{size or 'all'}", f"out={args.out}",
                 f"finetune.steps={steps}", f"finetune.budget={budget}", f"finetune.repeats={args.repeats}",
                 f"finetune.ks=[{args.k}]", f"finetune.baselines=[{','.join(METHODS)}]", "finetune.enabled=true",
                 "bootstrap.samples=0", f"finetune.eval_every={args.eval_every}",
                 *pool_override(config, pool, args.language, args.same_topics)]
    if size:
        overrides.append(f"data.target_train_size={size}")
    cfg = convalue.load_config(config, overrides)
    t0 = time.perf_counter()
    address = os.environ.get("RAY_ADDRESS")
    try:
        summary = convalue.run(cfg)
    finally:  # Ray names the local cluster it started in RAY_ADDRESS: the next cell would try to join it
        if address is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = address
    if summary.status != "complete":
        raise SystemExit(f"cell {pool} n={size} steps={steps} {budget}: run ended {summary.status}: {summary.error}")
    rows = summary.finetune
    per_eval = {}
    for ev in args.evals:
        measure = Measure(ev, "loss")
        means: dict[str, list[float]] = {}
        for r in rows:
            if (v := measure.value(r)) is not None:
                means.setdefault(r["method"], []).append(v)
        per_eval[ev] = {"mean_loss": {m: sum(v) / len(v) for m, v in means.items()},
                        "kmm_minus": [d.to_dict() for d in paired_differences(rows, [args.k], "kmm", measure)],
                        "curves": [c for c in summary.evaluation.get("curves") or [] if c["evaluation"] == ev]}
    kmm_rows = [r for r in rows if r["method"] == "kmm"]
    return {"config": stem, "pool": pool, "target_train": summary.data["target_train"], "steps": steps,
            "budget": budget, "k": args.k, "seeds": summary.evaluation["seeds"],
            "kmm_bought": sorted({g for r in kmm_rows for g in r["groups"]}),
            "kmm_total_steps": sorted({r["steps"] for r in kmm_rows}), "evals": per_eval,
            "seconds": round(time.perf_counter() - t0, 1)}


def verdict(d: dict) -> str:
    """Which side the interval of KMM's loss minus the other's is on."""
    ci = d.get("ci95")
    if ci is None:
        return "one seed"
    return "KMM lower" if ci[1] < 0 else "KMM higher" if ci[0] > 0 else "unresolved"


def diff_text(d: dict) -> str:
    """KMM minus one method: mean [95 % interval], bold where the interval excludes 0."""
    ci = d.get("ci95")
    if ci is None:
        return f"{d['mean']:+.4f}"
    text = f"{d['mean']:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}]"
    return f"**{text}**" if ci[1] < 0 or ci[0] > 0 else text


def table(path: Path) -> str:
    """The markdown regime map of every cell in the jsonl (the last line of a cell wins)."""
    cells: dict[tuple, dict] = {}
    for line in path.read_text().splitlines():
        c = json.loads(line)
        for ev in c["evals"]:
            cells[(c["config"], c["pool"], c["target_train"], c["steps"], c["budget"], ev)] = c
    out = ["| target, pool | train examples | steps | budget | evaluation | KMM's top-k: loss (total steps) | "
           "target only | KMM − target only | KMM − One-Step | KMM − random |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (stem, pool, n, steps, budget, ev), c in sorted(cells.items(), key=lambda kv: kv[0]):
        e = c["evals"][ev]
        diffs = {d["method"]: diff_text(d) for d in e["kmm_minus"]}
        m = e["mean_loss"]
        out.append(f"| {stem}, {pool} | {n} | {steps} | {budget} | {ev} | {m.get('kmm', float('nan')):.4f} "
                   f"({'/'.join(map(str, c['kmm_total_steps']))}) | {m.get('target_only', float('nan')):.4f} | "
                   f"{diffs.get('target_only', '')} | {diffs.get('cosine', '')} | {diffs.get('random', '')} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "paper" / "regime_japanese.yaml"))
    ap.add_argument("--sizes", type=int, nargs="+", default=[8], help="target train sizes (0: the whole split)")
    ap.add_argument("--steps", type=int, nargs="+", default=[24], help="step budgets (finetune.steps)")
    ap.add_argument("--budgets", nargs="+", default=["additive", "fixed"], choices=["fixed", "additive"])
    ap.add_argument("--pools", nargs="+", default=["other"], choices=["other", "same"])
    ap.add_argument("--evals", nargs="+", default=["heldout", "target_val"], help="evaluations to read each cell on")
    ap.add_argument("--language", default="japanese", help="the target's language (pool `same`)")
    ap.add_argument("--same-topics", nargs="+", default=list(SAME_TOPICS), help="its topics added by pool `same`")
    ap.add_argument("--repeats", type=int, default=3, help="seeds per cell (default 3)")
    ap.add_argument("--k", type=int, default=3, help="the budget k of every method (default 3)")
    ap.add_argument("--out", default=str(ROOT / "runs"), help="runs folder (default runs/)")
    ap.add_argument("--jsonl", default=str(ROOT / "runs" / "selection-pays.jsonl"), help="cells are appended here")
    ap.add_argument("--eval-every", type=int, default=0,
                    help="finetune.eval_every: each fine-tune's learning curve, kept in the cell (default 0: none; "
                         "a curve keys the fine-tunes apart from those without one)")
    ap.add_argument("--table", action="store_true", help="print the table of --jsonl's cells and exit")
    args = ap.parse_args()
    if args.table:
        print(table(Path(args.jsonl)))
        return
    logging.getLogger("convalue").setLevel(logging.WARNING)
    for pool in args.pools:
        for size in args.sizes:
            for steps in args.steps:
                for budget in args.budgets:
                    c = cell(args.config, pool, size, steps, budget, args)
                    with open(args.jsonl, "a", encoding="utf-8") as f:
                        f.write(json.dumps(c) + "\n")
                    print(f"{pool} pool, target {c['target_train']} examples, {steps} steps, {budget}, k={args.k}, "
                          f"{len(c['seeds'])} seeds ({c['seconds']:.0f} s); KMM bought {c['kmm_bought']}",
                          flush=True)
                    for ev, e in c["evals"].items():
                        losses = ", ".join(f"{m} {v:.4f}" for m, v in e["mean_loss"].items())
                        print(f"  {ev}: mean loss {losses}", flush=True)
                        for d in e["kmm_minus"]:
                            print(f"    KMM minus {d['method']}: {diff_text(d)}, KMM lower in "
                                  f"{d['reference_lower']} of {d['seeds']}: {verdict(d)}", flush=True)
                        for line in curve_lines({"curves": e["curves"]}, ev)[1:]:
                            print(f"    curve: {line.strip()}", flush=True)


if __name__ == "__main__":
    main()
