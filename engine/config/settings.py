"""The settings sections: the selection, the evaluation fine-tunes, the bootstrap and Ray."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from convalue.engine.config.baselines import DataModelConfig, DeepSpeedConfig, GradExConfig
from convalue.engine.config.fields import ConfigError, opt
from convalue.engine.config.paths import BUILTIN_MODELS
from convalue.engine.config.rewards import BUILTIN_REWARDS, reward_spec_problem
from convalue.engine.config.sources import measure_parts
from convalue.engine.config.tuning import RhoTuningConfig

#: what a fine-tune is measured by (finetune.metrics), on every evaluation
METRICS = ("loss", "accuracy")


@dataclass(kw_only=True)
class SelectConfig:
    """Which candidates are bought."""

    k: int = opt(3, "Select the top-k candidates with a positive score.")

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value does not hold."""
        if self.k <= 0:
            raise ConfigError("must be > 0", field="k", value=self.k)


@dataclass(kw_only=True)
class FinetuneConfig:
    """The fixed-compute fine-tune that shows what a selection is worth (paper Alg. 1)."""

    enabled: bool = opt(True, "Run the fine-tune jobs.")
    steps: int = opt(30, "T: optimizer steps, the same for every compared run.")
    rho: float = opt(0.5, "Probability that a step draws a target batch (otherwise an auxiliary batch).")
    rho_by_k: dict[int, float] | None = opt(
        None, "Alg. 1's target-mixing ratio rho_k for some budgets: {k: rho}, e.g. {1: 0.7, 5: 0.4}; a k of `ks` not "
              "listed uses `rho`. Every k listed must be an evaluated budget. A fine-tune at k is keyed by its rho_k, "
              "so it is the same fine-tune as one run with `rho: rho_k`.")
    tune: RhoTuningConfig = opt(help="Choose rho_k per budget from a grid, on an evaluation that is not select_by's.",
                                factory=RhoTuningConfig)
    budget: Literal["fixed", "additive"] = opt(
        "fixed", "What an auxiliary step costs the target: `fixed` (the paper's Alg. 1: `steps` steps in all, each a "
        "target batch with probability rho, so auxiliary steps replace target steps) or `additive` (the target-only "
        "run's `steps` target batches are all kept, in the same order, and the auxiliary steps come on top: the same "
        "Bernoulli(rho) draws continue until `steps` target steps are drawn, so a run buying groups trains about "
        "steps / rho steps; the question a user who adds data asks). The target-only run is the same under both. "
        "Needs rho > 0 and strategy `task`.")
    batch_size: int = opt(4, "Examples per optimizer step.")
    lr: float = opt(1e-4, "AdamW learning rate (cosine schedule, 3% warm-up).")
    max_grad_norm: float = opt(1.0, "Gradient clipping norm.")
    eval_batch_size: int = opt(8, "Batch size of the validation-loss evaluation.")
    eval_every: int = opt(0, "Also measure every evaluation's loss every this many steps (0: at the end only): each "
                             "fine-tune's learning curve (`curve` in its record and evaluation.parquet, curves.png), "
                             "to see where more steps stop helping; it does not change the training. SFT `task` jobs.")
    seed: int = opt(0, "Seed of batch sampling and the Bernoulli(rho) draws.")
    repeats: int = opt(1, "R: fine-tunes per cell of the protocol, seeded seed, seed + 1, ..., seed + R - 1; the "
                          "run reports each cell's mean validation loss and its sample standard deviation over "
                          "the R seeds (paper App., multi-seed results), and best k and Borda on the means. The seeds "
                          "vary the training's draws and the random baseline's order (see `random_orders`); the "
                          "adapter starts at lora.init_seed, the valuation's linearisation point.")
    random_orders: Literal["per_seed", "one"] = opt(
        "per_seed", "The random baseline's order under `repeats`: `per_seed` (seed s draws its own order, so the "
        "cell's mean and the paired differences are over random selections as well as the training's draws) or "
        "`one` (every seed buys the order of `seed`: the spread is the training's alone). With one seed both are "
        "the order of `seed`.")
    mixture: Literal["uniform", "proportional", "softmax", "given"] = opt(
        "uniform", "How an auxiliary step picks one of the bought groups (paper App., auxiliary weighting): "
        "`uniform` (each alike), `proportional` (to its number of usable examples), `softmax` (softmax of the "
        "method's scores of the bought groups over `mixture_temperature`: the scores as mixture weights; the random "
        "baseline's scores are an order, so it stays uniform), `given` (the user's `mixture_weights`, e.g. the "
        "paper's popularity weights). The weights are normalised over each run's bought groups and are in its row.")
    mixture_weights: dict[str, float] | None = opt(
        None, "Weights of `mixture: given`: {group name: weight > 0} naming every candidate group, or only some with "
              "`mixture_default_weight` (a weight is relative: only the bought groups' weights are normalised, so "
              "{english: 2, hindi: 1} draws english twice as often as hindi where both are bought).")
    mixture_default_weight: float | None = opt(
        None, "Weight of `mixture: given` for a candidate group that `mixture_weights` does not name (the paper's "
              "popularity table gives the datasets it does not list its lowest tier; with a flat pool, the clusters "
              "whose names a run has not shown yet). null: `mixture_weights` must name every candidate.")
    mixture_temperature: float = opt(1.0, "T of `mixture: softmax`: weights exp(s_i / T), normalised; the scores' scale "
                                          "differs by method (KMM's w, beta, the cosine), so a lower T sharpens them.")
    baselines: list[Literal["target_only", "alignment", "cosine", "random", "datamodel", "datamodel_cs",
                            "gradex_fs", "gradex_re"]] = opt(
        help="Comparison runs with the same step budget: `target_only` (rho = 1, the same at every k); and "
        "methods ranked like KMM at every k in `ks`: `alignment` (top-k by beta), `cosine` (top-k by the "
        "cosine of g_i and g_tar: the paper's one-step baseline, free of gradient norms), `random` (a seeded "
        "random order, from `seed`; under `repeats`, see `random_orders`), `datamodel` and `datamodel_cs` (a "
        "LASSO fitted to the validation losses of fine-tunes of random subsets, uniform or compressed-sensing "
        "designs: `datamodel.runs_per_candidate` x N extra fine-tunes each), `gradex_fs` and `gradex_re` (GradEx: "
        "one multitask fine-tune on target + every candidate, per-example log-odds gradients there, a logistic "
        "surrogate; forward selection or a random ensemble). Their cost is in the summary.",
        factory=lambda: ["target_only"])
    datamodel: DataModelConfig = opt(help="The DataModel baselines' designs and fit.", factory=DataModelConfig)
    gradex: GradExConfig = opt(help="The GradEx baselines' projection, surrogate and ensemble.", factory=GradExConfig)
    metrics: list[Literal["loss", "accuracy"]] = opt(
        help="What each fine-tune is measured by, on every evaluation (the target's validation split and each of "
        "data.eval): `loss` (response-token cross-entropy, always) and `accuracy` (the mean of `accuracy_reward` "
        "over greedy completions: exact-match accuracy for tasks with checkable answers, such as the mathematics "
        "modules).", factory=lambda: ["loss"])
    select_by: str = opt(
        "loss", "The evaluation and metric that decide each method's best k, the Borda count, the paired intervals "
        "and the verdict: `EVAL:METRIC`, EVAL `target_val` (the target's validation split) or a name of data.eval, "
        "METRIC `loss` or `accuracy` (which needs it in `metrics`); a bare `loss` or `accuracy` is `target_val:` "
        "that metric. Every evaluation's tables are reported either way.")
    accuracy_reward: str = opt("numeric_exact_match", "accuracy: r(completion, reference) -> float, as "
                               "features.grpo_reward names one (a built-in, `module:function` or "
                               "`file.py:function`).")
    accuracy_max_new_tokens: int = opt(32, "accuracy: the longest greedy completion in tokens.")
    objective: Literal["sft", "grpo"] = opt(
        "sft", "How each evaluation fine-tune trains: `sft` (response-token cross-entropy) or `grpo` (GRPO: per step, "
        "`grpo_generations` completions sampled for each of `batch_size` prompts of the step's source, scored by "
        "`grpo_reward`, group-relative advantages, one AdamW step on the clipped surrogate with the k3 KL to theta_0; "
        "sampling seeded by `seed`). Both are validated by loss (and accuracy); `grpo` also reports the mean training "
        "reward of the first and last steps. `grpo` needs prompts with checkable references (the mathematics source, "
        "or data a user reward can score) and the `task` strategy.")
    grpo_reward: str = opt(
        "numeric_exact_match", "objective `grpo`: the training reward, named as features.grpo_reward names one (a "
        "built-in `numeric_exact_match` or `numeric_closeness`, `module:function` or `path/to/file.py:function`, read "
        "against the config file's folder).")
    grpo_reward_signature: Literal["pointwise", "trl"] = opt(
        "pointwise", "objective `grpo`: how `grpo_reward` is called: `pointwise` r(completion, reference) -> float, "
        "or `trl`, TRL's reward_funcs signature f(prompts=[...], completions=[...], <grpo_reward_column>=[...]) -> "
        "list[float] (prompts: the rendered prompt text; completions: the decoded completions).")
    grpo_reward_column: str = opt("answer", "objective `grpo` with grpo_reward_signature `trl`: the keyword the "
                                            "references are passed under.")
    grpo_generations: int = opt(4, "objective `grpo`: G, completions sampled per prompt.")
    grpo_max_new_tokens: int = opt(48, "objective `grpo`: longest completion in tokens.")
    grpo_temperature: float = opt(0.6, "objective `grpo`: sampling temperature.")
    grpo_top_p: float = opt(0.95, "objective `grpo`: nucleus sampling threshold.")
    grpo_kl_coef: float = opt(0.005, "objective `grpo`: weight of the k3 KL estimator against theta_0 (the adapter "
                                     "disabled) in the surrogate loss.")
    ks: list[int] | None = opt(
        None, "The budgets K of the evaluation protocol (paper Alg. 1): KMM and every ranked baseline are "
        "fine-tuned on their top-k positive groups at each k, and the run reports each method's best k and its "
        "Borda count over K. null: [select.k].")
    strategy: Literal["task", "deepspeed"] = opt(
        "task", "`task`: each fine-tune is one Ray task on one device; `deepspeed`: a Ray Train TorchTrainer of "
        "`deepspeed.workers` processes under DeepSpeed ZeRO (needs `pip install 'convalue[deepspeed]'`).")
    model: str | None = opt(
        None, "strategy `deepspeed`: fine-tune this model (a built-in name or a local Hugging Face folder) instead "
        "of the valuation model: value with a small model, fine-tune a larger one, as the paper does. null: "
        "model.source.")
    dtype: Literal["float32", "bfloat16"] | None = opt(None, "strategy `deepspeed`: the fine-tune model's dtype. "
                                                             "null: model.dtype.")
    deepspeed: DeepSpeedConfig = opt(help="The DeepSpeed ZeRO settings of strategy `deepspeed`.",
                                     factory=DeepSpeedConfig)

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value does not hold."""
        if self.steps <= 0:
            raise ConfigError("must be > 0", field="steps", value=self.steps)
        if not 0 <= self.rho <= 1:
            raise ConfigError("must be in [0, 1]", field="rho", value=self.rho)
        if self.batch_size <= 0:
            raise ConfigError("must be > 0", field="batch_size", value=self.batch_size)
        if self.budget == "additive":
            self._validate_additive()
        if not (self.mixture_temperature > 0 and math.isfinite(self.mixture_temperature)):
            raise ConfigError("must be a finite number > 0", field="mixture_temperature", value=self.mixture_temperature)
        if self.repeats <= 0:
            raise ConfigError("must be >= 1", field="repeats", value=self.repeats)
        for k, r in (self.rho_by_k or {}).items():
            if k <= 0 or not 0 <= r <= 1:
                raise ConfigError("must map budgets k > 0 to ratios in [0, 1]", field=f"rho_by_k.{k}", value=r)
        if self.tune.enabled:
            self.tune.validate_within(self)
        if self.mixture == "given" and self.mixture_weights is None:
            raise ConfigError("is required with `mixture: given` ({group name: weight})", field="mixture_weights")
        for name in ("mixture_weights", "mixture_default_weight"):
            if self.mixture != "given" and getattr(self, name) is not None:
                raise ConfigError(f"must be `given` to use {name} (or drop {name})", field="mixture",
                                  value=self.mixture)
        weights = {f"mixture_weights.{name}": v for name, v in (self.mixture_weights or {}).items()}
        if self.mixture_default_weight is not None:
            weights["mixture_default_weight"] = self.mixture_default_weight
        for where, v in weights.items():
            if not (v > 0 and math.isfinite(v)):
                raise ConfigError("must be a finite number > 0", field=where, value=v)
        if self.eval_batch_size <= 0:
            raise ConfigError("must be > 0", field="eval_batch_size", value=self.eval_batch_size)
        if self.eval_every < 0 or (self.eval_every and (self.objective, self.strategy) != ("sft", "task")):
            raise ConfigError("must be >= 0, and 0 unless objective `sft` runs with strategy `task`",
                              field="eval_every", value=self.eval_every)
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError("must be a finite number > 0", field="lr", value=self.lr)
        if len(set(self.baselines)) != len(self.baselines):
            raise ConfigError("lists a baseline twice", field="baselines", value=self.baselines)
        if self.ks is not None:
            if not self.ks or any(k <= 0 for k in self.ks) or len(set(self.ks)) != len(self.ks):
                raise ConfigError("must list distinct budgets k > 0 (or be null: select.k alone)", field="ks",
                                  value=self.ks)
        _, metric = self.select_by_parts()
        if metric not in METRICS:
            raise ConfigError(f"must be EVAL:METRIC with METRIC one of {list(METRICS)} (e.g. `target_val:loss`), "
                              "or a bare metric", field="select_by", value=self.select_by)
        if metric not in self.metrics or "loss" not in self.metrics:
            raise ConfigError(f"must list `loss` and select_by's `{metric}`", field="metrics", value=self.metrics)
        if "accuracy" in self.metrics:
            if self.accuracy_max_new_tokens <= 0:
                raise ConfigError("must be > 0", field="accuracy_max_new_tokens", value=self.accuracy_max_new_tokens)
            if (problem := reward_spec_problem(self.accuracy_reward)) is not None:
                raise ConfigError(problem, field="accuracy_reward", value=self.accuracy_reward)
            if self.strategy == "deepspeed":
                raise ConfigError("accuracy is measured by the `task` strategy's jobs only", field="metrics",
                                  value=self.metrics)
        if self.objective == "grpo":
            self._validate_grpo()
        for name in ("model", "dtype"):
            if getattr(self, name) is not None and self.strategy != "deepspeed":
                raise ConfigError("is used by strategy `deepspeed` only", field=name, value=getattr(self, name))
        if self.model is not None and self.model not in BUILTIN_MODELS and not (
                Path(self.model).expanduser() / "config.json").is_file():
            raise ConfigError(f"is neither a built-in model {list(BUILTIN_MODELS)} nor a Hugging Face model folder "
                              "(no config.json)", field="model", value=self.model)
        if self.strategy == "deepspeed":
            if importlib.util.find_spec("deepspeed") is None:
                raise ConfigError("needs DeepSpeed and Ray Train: pip install 'convalue[deepspeed]'",
                                  field="strategy", value=self.strategy)
            if self.batch_size < self.deepspeed.workers:
                raise ConfigError(f"must be at least deepspeed.workers ({self.deepspeed.workers}): every worker "
                                  "takes a share of each batch", field="batch_size", value=self.batch_size)

    def _validate_additive(self) -> None:
        """The checks of budget `additive`: every ratio > 0 (the draws run until `steps` target steps), task jobs."""
        if self.strategy == "deepspeed":
            raise ConfigError("`additive` runs as `task` jobs only (strategy `deepspeed` trains the fixed budget)",
                              field="budget", value=self.budget)
        if self.rho <= 0:
            raise ConfigError("must be > 0 with budget `additive` (the target's steps are kept: rho = 0 has none)",
                              field="rho", value=self.rho)
        for k, r in (self.rho_by_k or {}).items():
            if r <= 0:
                raise ConfigError("must be > 0 with budget `additive`", field=f"rho_by_k.{k}", value=r)

    def _validate_grpo(self) -> None:
        """The checks of objective `grpo`."""
        if self.strategy == "deepspeed":
            raise ConfigError("`grpo` fine-tunes run as `task` jobs only (strategy `deepspeed` trains SFT)",
                              field="objective", value=self.objective)
        if self.grpo_generations < 2:
            raise ConfigError("must be >= 2 (advantages are relative to the prompt's other completions)",
                              field="grpo_generations", value=self.grpo_generations)
        if self.grpo_max_new_tokens <= 0:
            raise ConfigError("must be > 0", field="grpo_max_new_tokens", value=self.grpo_max_new_tokens)
        if not (self.grpo_temperature > 0 and math.isfinite(self.grpo_temperature)):
            raise ConfigError("must be a finite number > 0", field="grpo_temperature", value=self.grpo_temperature)
        if not 0 < self.grpo_top_p <= 1:
            raise ConfigError("must be in (0, 1]", field="grpo_top_p", value=self.grpo_top_p)
        if not (self.grpo_kl_coef >= 0 and math.isfinite(self.grpo_kl_coef)):
            raise ConfigError("must be a finite number >= 0", field="grpo_kl_coef", value=self.grpo_kl_coef)
        if self.grpo_reward_signature == "trl" and self.grpo_reward in BUILTIN_REWARDS:
            raise ConfigError(f"the built-in `{self.grpo_reward}` is pointwise: use grpo_reward_signature "
                              "`pointwise`, or name a TRL reward function", field="grpo_reward_signature",
                              value=self.grpo_reward_signature)
        if not self.grpo_reward_column.isidentifier():
            raise ConfigError("must be a Python identifier (a keyword argument name)", field="grpo_reward_column",
                              value=self.grpo_reward_column)
        if (problem := reward_spec_problem(self.grpo_reward)) is not None:
            raise ConfigError(problem, field="grpo_reward", value=self.grpo_reward)

    def select_by_parts(self) -> tuple[str, str]:
        """(evaluation, metric) of select_by: `heldout:loss` -> ("heldout", "loss"); a bare `loss` -> ("target_val",
        "loss")."""
        return measure_parts(self.select_by)

    def seeds(self) -> list[int]:
        """The seeds every protocol cell is fine-tuned under: seed and the next repeats - 1."""
        return [self.seed + r for r in range(self.repeats)]

    def random_order_seed(self, seed: int) -> int:
        """The seed of the random baseline's order in the fine-tunes of `seed` (see random_orders)."""
        return seed if self.random_orders == "per_seed" else self.seed

    def tuning_seeds(self) -> list[int]:
        """The seeds of finetune.tune's fine-tunes: tune.repeats after the protocol's (none where not tuned)."""
        return [self.seed + self.repeats + r for r in range(self.tune.repeats)] if self.tune.enabled else []

    def rho_at(self, k: int | None) -> float:
        """rho_k of Alg. 1: the ratio of budget k (None: the target-only run), `rho` unless `rho_by_k` lists k."""
        return (self.rho_by_k or {}).get(k, self.rho)


@dataclass(kw_only=True)
class BootstrapConfig:
    """Uncertainty of the scores: KMM re-solved on previews resampled with replacement."""

    samples: int = opt(0, "B: bootstrap resamples. Each draws every group's preview examples (and the target's) with "
                          "replacement, re-forms the group vectors, K and beta in the run's metric, and solves KMM "
                          "with the run's solver settings; the run reports each group's score spread and how often "
                          "it is selected (bootstrap.parquet). 0: off. Needs features.keep_per_example. The "
                          "resamples are spread over ray.workers solver actors (ray.cpus_per_worker CPUs each); "
                          "each has its own seed, so the result does not depend on the spread.")
    seed: int = opt(0, "Seed of the resampling.")

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value does not hold."""
        if self.samples < 0:
            raise ConfigError("must be >= 0", field="samples", value=self.samples)


@dataclass(kw_only=True)
class RayConfig:
    """Where and how wide the run goes."""

    address: str | None = opt(None, "Existing cluster (`auto`, `ray://…` or host:port); absent: an embedded local cluster. "
                              "`--address` and RAY_ADDRESS override it.")
    workers: int = opt(2, "W: gradient-worker actors, each holding one model replica.")
    cpus_per_worker: int = opt(1, "CPUs (and torch threads) per worker.")
    gpus_per_worker: float = opt(0.0, "GPUs per worker (0: CPU).")
    max_in_flight: int = opt(2, "Calls in flight per worker (backpressure).")
    groups_per_call: int = opt(4, "Groups featurised per actor call (one returned block; their examples are packed together).")
    object_store_memory_mb: int | None = opt(None, "Object store size of the embedded cluster (default: Ray's).")
    dashboard: bool = opt(False, "Start the Ray dashboard with the embedded cluster (about 0.9 GB more memory).")

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value does not hold."""
        for name in ("workers", "cpus_per_worker", "max_in_flight", "groups_per_call"):
            if getattr(self, name) <= 0:
                raise ConfigError("must be > 0", field=name, value=getattr(self, name))
        if self.gpus_per_worker < 0:
            raise ConfigError("must be >= 0", field="gpus_per_worker", value=self.gpus_per_worker)
