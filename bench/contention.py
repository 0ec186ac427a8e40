"""Two featurisers at once on this machine's two cores, without Ray: how much slower each runs than one alone.

The bench/featurize.py data and featuriser (SmolLM2-135M, chatterbot groups, 2,048-token batches, 1 thread).
Three phases, each in fresh processes: one featuriser alone, two at once (they start their passes together),
one alone again, so drift of this shared host shows in the two alone phases. Every process times --passes
passes over all blocks and reads its own kernel time and minor page faults per pass (getrusage); the first
pass of each process (first touch of its memory) is left out of the medians. Prints the per-pass medians,
the slowdown of two at once against alone, the kernel share and the faults; ends with one JSON line.
What bench/featurize.py's (c) loses beyond this slowdown is Ray's.

`--workload matmul` runs the same three phases with plain single-thread float32 matrix products of the
model's MLP shape ([2048, 576] x [576, 1536], 3.6 GFLOP each, --matmuls per pass) instead of the featuriser:
the two cores' contention with no model, allocator or autograd in the way.

    .venv/bin/python bench/contention.py [--passes 3] [--workload featurise|matmul]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # bench.featurize sets the offline environment on import

from bench.featurize import add_data_args, one_featurizer  # noqa: E402

MM_SHAPE = (2048, 576, 1536)  # tokens of a 2,048-token batch x SmolLM2's hidden x intermediate size
MM_FLOP = 2 * MM_SHAPE[0] * MM_SHAPE[1] * MM_SHAPE[2]


def matmul_pass(n: int):
    """A function running n single-thread float32 products of the model's MLP shape."""
    import torch

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    m, k, c = MM_SHAPE
    a, b = torch.randn(m, k, generator=gen), torch.randn(k, c, generator=gen)
    out = torch.empty(m, c)

    def run() -> None:
        for _ in range(n):
            torch.mm(a, b, out=out)

    run()  # warm-up
    return run


def timed_passes(args: argparse.Namespace, start, out) -> None:
    """In a child process: build the workload, wait at `start`, then put [(wall, kernel s, minor faults)] per pass."""
    if args.workload == "matmul":
        one_pass = matmul_pass(args.matmuls)
    else:
        _, _, _, blocks, f = one_featurizer(args)

        def one_pass() -> None:
            for b in blocks:
                f.featurize(b)
    start.wait()
    passes = []
    for _ in range(args.passes):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        one_pass()
        r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        passes.append((t1 - t0, r1.ru_stime - r0.ru_stime, r1.ru_minflt - r0.ru_minflt))
    out.put(passes)


def phase(ctx, args: argparse.Namespace, n: int) -> list[list[tuple[float, float, int]]]:
    """Each of n processes' passes, run at once."""
    start, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=timed_passes, args=(args, start, out)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a {args.workload} process failed (exit code {p.exitcode})")
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_args(ap)
    ap.add_argument("--workload", choices=["featurise", "matmul"], default="featurise",
                    help="the bench/featurize.py featuriser, or plain single-thread matrix products")
    ap.add_argument("--matmuls", type=int, default=200, help="--workload matmul: products per pass")
    ap.set_defaults(passes=3)
    args = ap.parse_args()
    if args.matmuls < 1:
        ap.error(f"--matmuls must be >= 1, got {args.matmuls}")
    if args.passes < 2:
        ap.error(f"--passes must be >= 2 (the first pass is left out), got {args.passes}")

    ctx = mp.get_context("spawn")
    runs = {"alone_1": phase(ctx, args, 1), "two": phase(ctx, args, 2), "alone_2": phase(ctx, args, 1)}
    warm = {k: [p for proc in v for p in proc[1:]] for k, v in runs.items()}  # without each process's first pass
    alone = warm["alone_1"] + warm["alone_2"]
    med = {"alone": statistics.median(p[0] for p in alone), "two": statistics.median(p[0] for p in warm["two"])}
    kernel = sum(p[1] for p in alone) / sum(p[0] for p in alone)
    fig = {"bench": "contention", "workload": args.workload, "passes": args.passes,
           "pass_s": {k: [[round(p[0], 3) for p in proc] for proc in v] for k, v in runs.items()},
           "median_pass_s": {k: round(v, 3) for k, v in med.items()},
           "slowdown_two_vs_alone": round(med["two"] / med["alone"] - 1, 4),
           "kernel_share_alone": round(kernel, 4),
           "minor_faults_per_pass": {"first": statistics.median(proc[0][2] for v in runs.values() for proc in v),
                                     "later": statistics.median(p[2] for v in warm.values() for p in v)}}
    if args.workload == "matmul":
        fig |= {"matmuls": args.matmuls, "matmul_shape": MM_SHAPE,
                "gflop_s_alone": round(args.matmuls * MM_FLOP / med["alone"] / 1e9, 1)}
    else:
        fig["groups"] = args.groups
    print(f"passes after each process's first, median: alone {med['alone']:.2f} s, two at once {med['two']:.2f} s "
          f"-> each {100 * fig['slowdown_two_vs_alone']:.1f} % slower; passes {fig['pass_s']}")
    print(f"kernel time {100 * kernel:.2f} % of a pass alone; minor faults per pass: "
          f"{fig['minor_faults_per_pass']['first']:.0f} in the first, {fig['minor_faults_per_pass']['later']:.0f} later")
    print(json.dumps(fig))


if __name__ == "__main__":
    main()
