"""bf16 on one CUDA GPU: bf16 weights with autocast (what a replica with model.dtype bfloat16 runs) against bf16
weights alone, for every representation and the fine-tune jobs, each against fp32 on the same GPU.

For each of one-step gradients, task vectors (3 AdamW steps) and GRPO (the surrogate gradient from completions
sampled once in fp32, and the sampling itself): the cosine to fp32 and the time of a warm second pass. For the
fine-tune job (LoRA on the target, as actors/finetune_job.py runs it): base and final validation loss. Prints a
table and ends with one JSON line.

    python bench/bf16_autocast.py

`--device cpu` is a dry run of this script (bf16 on a CPU without bf16 matrix units is very slow: use small sizes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # bench.featurize sets the offline environment on import

from bench.featurize import bench_items, grpo_bench_items, grpo_spec, min_cosine, worker_spec  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (the point of this script) or cpu (a dry run)")
    ap.add_argument("--groups", type=int, default=6, help="chatterbot groups for one-step gradients")
    ap.add_argument("--m", type=int, default=32, help="examples per chatterbot group")
    ap.add_argument("--grpo-prompts", type=int, default=8, help="prompts per mathematics group (2 groups, G = 8)")
    ap.add_argument("--finetune-steps", type=int, default=24)
    args = ap.parse_args()

    import torch

    from convalue.engine.config.sections import (
        DataConfig,
        FeaturesConfig,
        FinetuneConfig,
        LoraConfig,
        ModelConfig,
        SourceConfig,
    )
    from convalue.engine.data.prepare import prepare
    from convalue.engine.features.replica import build_featurizer
    from convalue.engine.model.loading import (
        autocast_dtype,
        load_model,
        load_tokenizer,
        resolve_model_dir,
    )
    from convalue.engine.protocol.finetune import evaluate_loss, finetune

    dev = args.device
    if dev.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("bench/bf16_autocast.py: no CUDA device here; use --device cpu for a dry run")
    model_dir = resolve_model_dir(ModelConfig())
    tok = load_tokenizer(model_dir)
    items = bench_items(tok, args.groups, args.m, 256)
    spec = worker_spec(model_dir, tok.pad_token_id, 32768, device=dev, max_length=256)
    math = grpo_bench_items(tok, args.grpo_prompts, 256)

    def timed(fn):
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t0, out

    def variants(s: dict) -> list[tuple[str, object]]:
        """fp32; bf16 weights alone (autocast switched off); bf16 weights + autocast, as build_featurizer makes it."""
        pure = build_featurizer(s | {"dtype": "bfloat16"})
        pure.autocast_dtype = None
        return [("fp32", build_featurizer(s)), ("bf16", pure), ("bf16_autocast", build_featurizer(s | {"dtype": "bfloat16"}))]

    fig: dict = {"bench": "bf16_autocast", "device": dev,
                 "gpu": torch.cuda.get_device_name(0) if dev.startswith("cuda") else "none"}
    rows = []
    tv = spec | {"features": asdict(FeaturesConfig(representation="task_vector", tv_steps=3))}
    for label, s, its in [("one_step", spec, items), ("task_vector", tv, items[:3])]:
        vecs = {}
        for name, f in variants(s):
            f.featurize(its)  # cold pass: new kernel shapes
            t, X = timed(lambda f=f, its=its: f.featurize(its))
            vecs[name] = {it.name: x for it, x in zip(its, X)}
            rows.append((label, name, t, min_cosine(vecs["fp32"], vecs[name])))

    grpo = grpo_spec(spec)
    completions, grads = None, {}
    for name, f in variants(grpo):
        f.sample(math[0].name, math[0].examples[:1])
        for _ in range(2):  # the second pass is warm
            t_sample, sampled = timed(lambda f=f: [f.sample(it.name, it.examples) for it in math])
        completions = completions or sampled  # fp32's: every variant's gradient from the same completions
        for _ in range(2):
            t, g = timed(lambda f=f, c=completions: {it.name: f.surrogate_gradient(it, cc) for it, cc in zip(math, c)})
        grads[name] = g
        rows.append(("grpo", name, t, min_cosine(grads["fp32"], g)))
        rows.append(("grpo_sampling", name, t_sample, float("nan")))

    target = prepare(DataConfig(target=SourceConfig(kind="chatterbot", include=["marathi"]),
                                candidates=[SourceConfig(kind="chatterbot", include=["hindi"])], preview_size=4),
                     tok, 128)
    cfg = FinetuneConfig(steps=args.finetune_steps, batch_size=4, lr=2e-4)
    for name, dtype, on in [("fp32", "float32", True), ("bf16", "bfloat16", False), ("bf16_autocast", "bfloat16", True)]:
        torch.manual_seed(0)
        ac = autocast_dtype(dev, dtype) if on else None
        model = load_model(model_dir, dtype, dev)
        t, res = timed(lambda model=model, ac=ac, name=name: finetune(
            model, tok.pad_token_id, cfg, LoraConfig(), label=name, target=target.target_train, aux={},
            val=target.target_val, device=dev, autocast_dtype=ac,
            base_val_loss=evaluate_loss(model, target.target_val, 8, tok.pad_token_id, dev, ac)))
        fig[f"finetune_{name}"] = {"base_val_loss": round(res.base_val_loss, 4), "val_loss": round(res.val_loss, 4),
                                   "s": round(t, 2)}

    print(f"{'':14s} {'variant':14s} {'warm s':>8s} {'cos vs fp32':>12s}")
    for label, name, t, cos in rows:
        print(f"{label:14s} {name:14s} {t:8.3f} " + (f"{cos:12.6f}" if cos == cos else ""))
        fig[f"{label}_{name}"] = {"s": round(t, 3)} | ({} if cos != cos else {"cos_vs_fp32": round(cos, 6)})
    for name in ("fp32", "bf16", "bf16_autocast"):
        ft = fig[f"finetune_{name}"]
        print(f"fine-tune      {name:14s} {ft['s']:8.2f}  val loss {ft['base_val_loss']} -> {ft['val_loss']}")
    print(json.dumps(fig))


if __name__ == "__main__":
    main()
