"""From the data config to tokenised previews: split, sample, tokenise and validate every group."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import astuple, dataclass, field
from typing import TYPE_CHECKING

from convalue.engine.config import DataConfig
from convalue.engine.config.sources import TARGET_VAL
from convalue.engine.data.clustering import Embed
from convalue.engine.data.evalsets import EvalSet, load_evaluations, target_val_set
from convalue.engine.data.examples import DataError, Example, Group
from convalue.engine.data.leakage import LeakageReport, ProtectedSet, drop_leaks
from convalue.engine.data.sources import preview_indices, resolve_groups, sample_order, split_target
from convalue.engine.data.tokenize import (
    TokenizedExample,
    WorkItem,
    tokenize_examples,
    tokenize_prompt,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("convalue")
TARGET_KEY = "__target__"


@dataclass
class PreparedData:
    """Everything the featurisation and fine-tune stages need, validated."""

    target: Group
    target_train: list[TokenizedExample]
    target_val: list[TokenizedExample]
    target_item: WorkItem
    candidates: list[Group]
    items: list[WorkItem]
    warnings: list[str] = field(default_factory=list)
    resolved: list[Group] = field(default_factory=list)  # every candidate group, the skipped small ones too
    evals: list[EvalSet] = field(default_factory=list)  # data.eval's sets (the target's validation split aside)
    leakage: LeakageReport | None = None  # what the leakage check dropped from the candidates

    def names(self) -> list[str]:
        """Candidate names in run order."""
        return [it.name for it in self.items]

    def summary_fields(self) -> dict:
        """What summary.json's `data` records of the evaluations and the leakage check."""
        sets = [{"name": TARGET_VAL, "source": f"the target's validation split ({self.target.name})",
                 "examples": len(self.target_val)}] + [e.to_dict() for e in self.evals]
        return {"evaluations": sets} | ({} if self.leakage is None else {"leakage": self.leakage.to_dict()})


def examples_digest(examples: list) -> str:
    """Content hash of tokenised examples (TokenizedExample or PromptExample), in order."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(repr(astuple(ex)).encode())
    return h.hexdigest()[:32]


def preview_key(item: WorkItem) -> str:
    """Content hash of a group's tokenised preview (a stored vector is reused only when it matches)."""
    return examples_digest(item.examples)


def _usable(tokens: list[TokenizedExample]) -> list[TokenizedExample]:
    return [t for t in tokens if t.n_response > 0]


def _preview_units(tokenizer, examples: list[Example], max_length: int, grpo: bool) -> tuple[list, int]:
    """(usable featurisation units, how many did not fit the context): SFT examples with response tokens
    left after truncation, or GRPO prompts that leave room to generate."""
    if grpo:
        prompts = [tokenize_prompt(tokenizer, ex, max_length) for ex in examples]
        good = [p for p in prompts if len(p) < max_length]
        return good, len(prompts) - len(good)
    toks = tokenize_examples(tokenizer, examples, max_length)
    good = _usable(toks)
    too_long = sum(1 for t in toks if t.n_response == 0 and len(t) >= max_length)
    return good, too_long


def target_splits(target: Group, cfg: DataConfig) -> tuple[list[Example], list[Example]]:
    """The target's seeded (train, validation) split, the train split cut to data.target_train_size if set."""
    train, val = split_target(target, cfg.val_fraction, cfg.seed)
    if cfg.target_train_size is not None:
        if cfg.target_train_size > len(train):
            raise DataError(f"data.target_train_size={cfg.target_train_size}: target group {target.name!r} "
                            f"({target.origin}) has only {len(train)} train examples after holding out "
                            f"val_fraction={cfg.val_fraction}")
        train = [train[i] for i in preview_indices(len(train), cfg.target_train_size, cfg.seed, f"{TARGET_KEY}/train")]
    return train, val


def prepare(cfg: DataConfig, tokenizer: PreTrainedTokenizerBase, max_length: int, *, grpo: bool = False,
            embed: Embed | None = None) -> PreparedData:
    """Resolve groups, split the target, sample seeded previews of m usable examples, tokenise, validate.

    With grpo, previews hold prompts (PromptExample) rather than SFT examples; the fine-tune splits stay SFT.
    embed: how a flat pool's texts are embedded (default: in this process).
    """
    target, candidates = resolve_groups(cfg, embed=embed)
    if any(g.name == TARGET_KEY for g in candidates):
        raise DataError(f"group name {TARGET_KEY!r} is reserved")
    train, val = target_splits(target, cfg)
    evals, warnings = load_evaluations(cfg, tokenizer, max_length, train)
    # before any scoring: no candidate example may equal one the target trains or is evaluated on
    protected = [ProtectedSet("target_train", split_target(target, cfg.val_fraction, cfg.seed)[0]),
                 ProtectedSet(TARGET_VAL, val), *(ProtectedSet(e.name, e.examples) for e in evals)]
    candidates, leakage = drop_leaks(candidates, protected)
    warnings += [g.warning() for g in leakage.groups]
    train_tok = _usable(tokenize_examples(tokenizer, train, max_length))
    val_tok = _usable(tokenize_examples(tokenizer, val, max_length))
    for split, kept, drawn in (("train", train_tok, train), ("validation", val_tok, val)):
        if 0 < len(kept) < len(drawn):  # none left is the error below
            warnings.append(f"target group {target.name!r} {split} split: {len(drawn) - len(kept)} of {len(drawn)} "
                            f"example(s) without response tokens after truncation to model.max_length={max_length} "
                            f"were not used")
    if not train_tok or not val_tok:
        raise DataError(f"target group {target.name!r} ({target.origin}) has no response tokens in its "
                        f"{'train' if not train_tok else 'validation'} split after formatting and truncation "
                        f"to model.max_length={max_length}: empty responses, or prompts longer than the context")
    m_tar = cfg.target_preview_size or cfg.preview_size
    if grpo:
        train_units, too_long = _preview_units(tokenizer, train, max_length, grpo=True)
        if not train_units:
            raise DataError(f"target group {target.name!r} ({target.origin}): all {too_long} train prompts are "
                            f"longer than the context (model.max_length={max_length}); no room to generate")
    else:
        train_units = train_tok
    idx = preview_indices(len(train_units), m_tar, cfg.seed, TARGET_KEY)
    target_item = WorkItem(TARGET_KEY, tuple(train_units[i] for i in idx))

    items, kept = [], []
    for g in candidates:
        # sample a preview, tokenise it, and replace unusable examples from the rest of the group
        order = sample_order(len(g.examples), cfg.seed, g.name)
        usable: list = []
        dropped = too_long = seen = 0
        for start in range(0, len(order), cfg.preview_size):
            chunk = [g.examples[i] for i in order[start : start + cfg.preview_size]]
            good, long_ = _preview_units(tokenizer, chunk, max_length, grpo)
            seen += len(chunk)
            dropped += len(chunk) - len(good)
            too_long += long_
            usable.extend(good)
            if len(usable) >= cfg.preview_size:
                break
        usable = usable[: cfg.preview_size]
        if not usable:
            if too_long == seen:
                msg = (f"candidate group {g.name!r} ({g.origin}): all {seen} examples are longer than the context "
                       f"(model.max_length={max_length}): no "
                       f"{'room to generate' if grpo else 'response token survives truncation'}")
            else:
                msg = (f"candidate group {g.name!r} ({g.origin}) has no usable example: {seen - too_long} with an "
                       f"empty response, {too_long} longer than model.max_length={max_length}")
            if cfg.small_groups == "error":
                raise DataError(msg + "; raise model.max_length, exclude the group, or set data.small_groups to "
                                "`skip` or `keep` (a group with nothing usable is then skipped)")
            warnings.append(msg + ": skipped")  # `keep` keeps what a group has; this one has nothing to value
            continue
        if dropped:
            warnings.append(f"group {g.name!r}: {dropped} example(s) without response tokens or room to generate "
                            "were not used")
        if len(usable) < cfg.preview_size:
            msg = (f"candidate group {g.name!r} ({g.origin}) has {len(usable)} usable example(s), fewer than "
                   f"data.preview_size={cfg.preview_size}")
            if cfg.small_groups == "error":
                raise DataError(msg + " (set data.small_groups to `skip` or `keep`, or lower preview_size)")
            if cfg.small_groups == "skip":
                warnings.append(msg + ": skipped")
                continue
            warnings.append(msg + ": kept with all it has")
        items.append(WorkItem(g.name, tuple(usable)))
        kept.append(g)
    if not items:
        gone = f" (the leakage check dropped {len(leakage.removed)} whole)" if leakage.removed else ""
        raise DataError(f"no candidate group is left to value{gone}")
    for w in warnings:
        log.warning(w)
    return PreparedData(target, train_tok, val_tok, target_item, kept, items, warnings, candidates, evals, leakage)


def evaluation_sets(data: PreparedData, cfg: DataConfig) -> list[EvalSet]:
    """Every evaluation a fine-tune is measured on: the target's validation split (`target_val`, as text for
    accuracy and tokenised), then data.eval's sets in the config's order."""
    return [target_val_set(data.target.name, target_splits(data.target, cfg)[1], data.target_val), *data.evals]


def full_items(data: PreparedData, tokenizer: PreTrainedTokenizerBase, max_length: int) -> tuple[WorkItem,
                                                                                                 list[WorkItem]]:
    """(target, candidates) work items holding every usable example of each group, not its preview: the data of
    a task vector as the paper defines it (a short fine-tune on the group)."""
    target = WorkItem(TARGET_KEY, tuple(data.target_train))
    return target, [WorkItem(g.name, tuple(_usable(tokenize_examples(tokenizer, list(g.examples), max_length))))
                    for g in data.candidates]
