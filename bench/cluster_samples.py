"""The selected clusters' samples that `convalue run` prints: convalue.engine.report.tables against a scan per cluster, in one run.

A clusters.parquet-shaped table (--examples rows over --clusters groups, real chatterbot prompts); --named of
the clusters are printed. (a) the baseline: every row as a Python dict, scanned once per named cluster (what
format_cluster_samples did before c11bdc5); (b) format_cluster_samples (one filter, one pass). Checks that both
print the same text; prints the best of --repeat for each and the ratio (a)/(b); ends with one JSON line.

    .venv/bin/python bench/cluster_samples.py [--examples 200000] [--clusters 3000] [--named 50]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])
sys.path.append(str(Path(__file__).resolve().parent))

from timing import timed  # noqa: E402


def scan_per_cluster(table, groups: list[str], n: int = 2, width: int = 60) -> str:
    """The baseline: the former format_cluster_samples (all rows to dicts, one scan per named cluster)."""
    rows = table.select(["group", "prompt"]).to_pylist()
    lines = ["what the selected clusters hold (first prompts; all in clusters.parquet):"]
    for g in groups:
        prompts = [r["prompt"] for r in rows if r["group"] == g]
        distinct = list(dict.fromkeys(prompts))[:n]
        shown = " | ".join(repr(p if len(p) <= width else p[: width - 1] + "…") for p in distinct)
        lines.append(f"  {g} ({len(prompts)} examples): {shown}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=200_000)
    ap.add_argument("--clusters", type=int, default=3000)
    ap.add_argument("--named", type=int, default=50, help="clusters printed (the run's selection)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    import numpy as np
    import pyarrow as pa

    from convalue.engine.config.sections import SourceConfig
    from convalue.engine.data.sources import load_source
    from convalue.engine.report.tables import format_cluster_samples

    prompts = [ex.messages[0][1] for g in load_source(SourceConfig(kind="chatterbot")).values() for ex in g.examples]
    rng = np.random.default_rng(0)
    labels = rng.integers(0, args.clusters, size=args.examples)
    table = pa.table({"group": [f"pool/c{c}" for c in labels],
                      "prompt": [prompts[i % len(prompts)] for i in range(args.examples)]})
    named = [f"pool/c{c}" for c in range(min(args.named, args.clusters))]
    t_scan, text_scan = timed(scan_per_cluster, table, named, repeat=args.repeat)
    t_new, text_new = timed(format_cluster_samples, table, named, repeat=args.repeat)
    if text_new != text_scan:
        raise SystemExit("format_cluster_samples printed another text than the per-cluster scan")
    ratio = t_scan / t_new
    print(f"{args.examples} examples, {args.clusters} clusters, {len(named)} printed: per-cluster scan "
          f"{1e3 * t_scan:.1f} ms, format_cluster_samples {1e3 * t_new:.1f} ms ({ratio:.1f}x), the same text")
    print(json.dumps({"bench": "cluster_samples", "examples": args.examples, "clusters": args.clusters,
                      "named": len(named), "scan_s": t_scan, "format_s": t_new, "ratio": ratio, "same_text": True}))


if __name__ == "__main__":
    main()
