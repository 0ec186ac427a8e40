"""The evaluations every fine-tune is measured on: the target's validation split (`target_val`) and the named sets
of data.eval, each loaded from any source kind, kept apart from the target's training data and tokenised once."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from convalue.engine.config import DataConfig, SourceConfig
from convalue.engine.config.sources import TARGET_VAL
from convalue.engine.data.examples import DataError, Example, Group
from convalue.engine.data.leakage import ProtectedSet, drop_leaks
from convalue.engine.data.sources import load_source, preview_indices
from convalue.engine.data.tokenize import TokenizedExample, tokenize_examples

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("convalue")
EVAL_KEY = "__eval__"  # the salt of an evaluation's seeded sample (data.eval_size)


@dataclass(frozen=True)
class EvalSet:
    """One named evaluation: where it comes from, its examples as text (for accuracy) and those of them with
    response tokens after truncation, tokenised (for the loss)."""

    name: str
    source: str
    examples: tuple[Example, ...]
    tokens: tuple[TokenizedExample, ...]

    def to_dict(self) -> dict:
        """As summary.json's data.evaluations lists it."""
        return {"name": self.name, "source": self.source, "examples": len(self.tokens)}


def describe_source(src: SourceConfig) -> str:
    """A source in words: its kind, path and the groups it keeps."""
    what = src.kind + (f" {src.path}" if src.path else "")
    if src.include:
        what += f" [{', '.join(src.include[:6])}{', ...' if len(src.include) > 6 else ''}]"
    if src.exclude:
        what += f" without [{', '.join(src.exclude[:6])}{', ...' if len(src.exclude) > 6 else ''}]"
    return what


def target_val_set(name: str, val: list[Example], tokens: list[TokenizedExample]) -> EvalSet:
    """The target's validation split as the evaluation `target_val` (name: the target group's)."""
    return EvalSet(TARGET_VAL, f"the target's validation split ({name})", tuple(val), tuple(tokens))


def load_evaluations(cfg: DataConfig, tokenizer: PreTrainedTokenizerBase, max_length: int,
                     train: list[Example]) -> tuple[list[EvalSet], list[str]]:
    """The sets of data.eval, in the config's order, and their warnings: each source's groups pooled, every example
    equal to a target training example dropped, cut to data.eval_size by a seeded sample, tokenised."""
    sets, warnings = [], []
    protect = [ProtectedSet("target_train", train)]
    for name, src in (cfg.eval or {}).items():
        groups = load_source(src)
        examples = [ex for g in groups.values() for ex in g.examples]
        where = f"data.eval.{name} ({describe_source(src)})"
        if not examples:
            raise DataError(f"{where}: no examples")
        pooled, _ = drop_leaks([Group(name, examples, where)], protect)
        if not pooled:
            raise DataError(f"{where}: every one of its {len(examples)} examples equals a target training example, "
                            "so it measures nothing the target does not train on")
        if len(pooled[0].examples) < len(examples):
            warnings.append(f"evaluation {name!r}: {len(examples) - len(pooled[0].examples)} of its {len(examples)} "
                            "example(s) equal target training examples: left out of the evaluation")
        examples = pooled[0].examples
        if cfg.eval_size is not None and len(examples) > cfg.eval_size:
            examples = [examples[i] for i in preview_indices(len(examples), cfg.eval_size, cfg.seed,
                                                             f"{EVAL_KEY}/{name}")]
        tokens = [t for t in tokenize_examples(tokenizer, examples, max_length) if t.n_response > 0]
        if not tokens:
            raise DataError(f"{where}: no example has response tokens after formatting and truncation to "
                            f"model.max_length={max_length}")
        sets.append(EvalSet(name, describe_source(src), tuple(examples), tuple(tokens)))
    return sets, warnings

