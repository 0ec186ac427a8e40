"""The input sections: the base model, the LoRA adapter, the projection and the group vectors (the data sections
are in sources.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from convalue.engine.config.fields import ConfigError, opt
from convalue.engine.config.paths import (
    BUILTIN_EMBEDDINGS,
    BUILTIN_MODELS,
    is_explicit_path,
    is_hub_id,
)
from convalue.engine.config.rewards import reward_spec_problem
from convalue.engine.config.sources import DataConfig, SourceConfig

__all__ = ["BUILTIN_EMBEDDINGS", "BUILTIN_MODELS", "DataConfig", "FeaturesConfig", "LoraConfig", "ModelConfig",
           "ProjectionConfig", "SourceConfig"]


@dataclass(kw_only=True)
class ModelConfig:
    """The base model theta_0."""

    source: str = opt("smollm2-135m-instruct",
                      "A built-in model name (`smollm2-135m-instruct`), a local Hugging Face model folder (as "
                      "save_pretrained writes it: config.json, weights, a fast tokenizer; checked before any worker "
                      "starts; a relative folder is read against the config file's folder, and `./` marks a folder "
                      "whose name could be a hub id), or a hub id `org/name`, resolved through huggingface_hub's "
                      "cache (HF_HUB_CACHE or HF_HOME): downloaded once where the hub can be reached; with "
                      "HF_HUB_OFFLINE=1 only the cache is read, and a model not in it is an error that says how to "
                      "fetch it.")
    revision: str = opt("main", "A hub id's branch, tag or commit hash; the run records the commit it resolved to. "
                                "Built-in models and local folders have none (leave `main`).")
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
                         "Where built-in models are converted once to safetensors (keyed by transformers version); a "
                         "relative folder is read against the config file's folder. Hub models live in the Hugging Face "
                         "cache instead.")

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value does not hold."""
        if self.batch_size <= 0:
            raise ConfigError("must be > 0", field="batch_size", value=self.batch_size)
        if self.token_budget is not None and self.token_budget < self.max_length:
            raise ConfigError(f"must be >= max_length ({self.max_length}) so every example fits a batch",
                              field="token_budget", value=self.token_budget)
        if self.split_cost_tokens is not None and self.split_cost_tokens < 0:
            raise ConfigError("must be >= 0 (or null)", field="split_cost_tokens", value=self.split_cost_tokens)
        if self.max_length < 8:
            raise ConfigError("must be >= 8", field="max_length", value=self.max_length)
        if not self.revision.strip():
            raise ConfigError("must be a branch, tag or commit", field="revision", value=self.revision)
        if self.on_hub():
            return
        if self.revision != "main":
            raise ConfigError("applies to a hub id (`org/name`), not to a built-in model or a local folder",
                              field="revision", value=self.revision)
        if self.source not in BUILTIN_MODELS:
            path = Path(self.source).expanduser()
            if not path.is_dir():
                raise ConfigError(
                    f"is neither a built-in model {list(BUILTIN_MODELS)}, an existing local folder, nor a Hugging "
                    "Face hub id (`org/name`)", field="source", value=self.source)
            if not (path / "config.json").is_file():
                raise ConfigError("folder has no config.json: not a Hugging Face model folder",
                                  field="source", value=self.source)

    def on_hub(self) -> bool:
        """Whether source names a hub repository: `org/name` in form, and not a local folder."""
        return (self.source not in BUILTIN_MODELS and not is_explicit_path(self.source)
                and is_hub_id(self.source) and not Path(self.source).is_dir())


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
        """Raise ConfigError naming the first field whose value does not hold."""
        if self.r <= 0:
            raise ConfigError("must be > 0", field="r", value=self.r)
        if self.alpha <= 0:
            raise ConfigError("must be > 0", field="alpha", value=self.alpha)
        if not self.target_modules:
            raise ConfigError("must name at least one module", field="target_modules", value=self.target_modules)
        if not 0 <= self.dropout < 1:
            raise ConfigError("must be in [0, 1)", field="dropout", value=self.dropout)


@dataclass(kw_only=True)
class ProjectionConfig:
    """The seeded random projection applied to every gradient."""

    kind: Literal["countsketch", "rademacher", "gaussian", "identity"] = opt(
        "countsketch", "`countsketch` (sparse JL, O(d) per vector), `rademacher` or `gaussian` (dense, generated and "
        "applied in blocks; d x p work per vector), `identity` (no compression).")
    dim: int = opt(8192, "p: projected dimension (ignored by `identity`).")
    seed: int = opt(0, "Projection seed; the same seed gives the same vectors in any worker or process.")

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value does not hold."""
        if self.dim <= 0:
            raise ConfigError("must be > 0", field="dim", value=self.dim)


@dataclass(kw_only=True)
class FeaturesConfig:
    """What vector represents a group (paper Sec. 3.1) and the metric of the Gram (paper App. F.1)."""

    representation: Literal["one_step", "task_vector", "grpo"] = opt(
        "one_step", "`one_step`: the mean SFT-loss gradient at theta_0; `task_vector`: tau = theta - theta_0 after "
        "a short fine-tune on the group alone (see `tv_data`, `tv_steps`); `grpo`: the mean GRPO surrogate-loss "
        "gradient at theta_0 over sampled completions scored by `grpo_reward`.")
    representations: list[Literal["one_step", "task_vector", "grpo"]] | None = opt(
        None, "Several representations valued in one run (the paper's comparison): each is featurised (its vectors "
        "in `vectors/` for the first, `vectors-<name>/` for the others) and KMM solved on it; the evaluation then "
        "ranks by each one's cosine (`one_step`, `tv`, `grpo`) and KMM scores (`one_step+kmm`, `tv+kmm`, ...) beside "
        "`kmm` (the first's). The first is the run's own (`representation` must be it or left out). null: "
        "`representation` alone.")
    parameters: Literal["lora", "full"] = opt(
        "lora", "`lora`: the adapter's lora_B (one_step, grpo) or lora_A and lora_B (task_vector); `full`: every "
        "base-model weight (needs a compressing projection; groups are featurised one at a time).")
    metric: Literal["euclidean", "diag_fisher"] = opt(
        "euclidean", "`euclidean`: K = G G^T; `diag_fisher`: K = G M G^T with M = diag(mean_i g_i^2) over the "
        "candidates' (projected) vectors and beta on M's support, the paper's diagonal empirical Fisher (App. F.1).")
    keep_per_example: bool = opt(
        False, "one_step with packing (model.token_budget): also store every preview example's projected gradient "
        "beside its group's mean (for confidence intervals); turns prefix sharing off.")
    tv_data: Literal["group", "preview_shortcut"] = opt(
        "group", "Task vectors: `group` fine-tunes on the group's data (the paper's definition); `preview_shortcut` "
        "on its m-example preview only (cheaper, and a different vector).")
    tv_steps: int | None = opt(None, "Task vectors: optimizer steps per group. null: `tv_fraction` of finetune.steps "
                                     "(the paper: a fraction of the target fine-tune's steps).")
    tv_fraction: float = opt(0.25, "Task vectors: the share of finetune.steps a group's fine-tune takes when "
                                   "`tv_steps` is null.")
    tv_lr: float = opt(1e-3, "Task vectors: AdamW learning rate.")
    tv_batch_size: int = opt(4, "Task vectors: examples per step.")
    grpo_reward: str = opt(
        "numeric_exact_match", "GRPO: the reward function r(completion, reference) -> float: a built-in, "
        "`numeric_exact_match` (1 if the completion's last number equals the reference's) or `numeric_closeness` "
        "(exact: 1, a wrong number: up to 0.5 by closeness), or `module:function`, or `path/to/file.py:function` (a "
        "relative file: to the config file's folder).")
    grpo_generations: int = opt(4, "GRPO: G, completions sampled per prompt.")
    grpo_max_new_tokens: int = opt(48, "GRPO: longest completion in tokens.")
    grpo_temperature: float = opt(0.6, "GRPO: sampling temperature.")
    grpo_top_p: float = opt(0.95, "GRPO: nucleus sampling threshold.")
    grpo_kl_coef: float = opt(0.005, "GRPO: weight of the k3 KL estimator against theta_0 in the surrogate loss.")
    grpo_seed: int = opt(0, "GRPO: sampling seed (each group's generate call is seeded by this seed and the group's name).")

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value does not hold."""
        for name in ("tv_batch_size", "grpo_max_new_tokens"):
            if getattr(self, name) <= 0:
                raise ConfigError("must be > 0", field=name, value=getattr(self, name))
        if self.tv_steps is not None and self.tv_steps <= 0:
            raise ConfigError("must be > 0 (or null)", field="tv_steps", value=self.tv_steps)
        if not 0 < self.tv_fraction <= 1:
            raise ConfigError("must be in (0, 1]", field="tv_fraction", value=self.tv_fraction)
        if self.representations is not None:
            if not self.representations or len(set(self.representations)) != len(self.representations):
                raise ConfigError("must list distinct representations (or be null)", field="representations",
                                  value=self.representations)
            if self.representation not in (self.representations[0], "one_step"):
                raise ConfigError(f"must be the first of `representations` ({self.representations[0]}) or left out",
                                  field="representation", value=self.representation)
            self.representation = self.representations[0]
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
        if "grpo" in (self.representations or [self.representation]):
            if (problem := reward_spec_problem(self.grpo_reward)) is not None:
                raise ConfigError(problem, field="grpo_reward", value=self.grpo_reward)
