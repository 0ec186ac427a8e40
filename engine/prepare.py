"""From the data config to tokenised previews: split, sample, tokenise and validate every group."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field

from engine.config import DataConfig
from engine.data import (
    DataError,
    Group,
    preview_indices,
    resolve_groups,
    sample_order,
    split_target,
)
from engine.featurize import WorkItem
from engine.tokenize import TokenizedExample, tokenize_examples

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

    def names(self) -> list[str]:
        """Candidate names in run order."""
        return [it.name for it in self.items]


def preview_key(item: WorkItem) -> str:
    """Content hash of a group's tokenised preview (a stored vector is reused only when it matches)."""
    h = hashlib.sha256()
    for ex in item.examples:
        h.update(repr((ex.input_ids, ex.labels)).encode())
    return h.hexdigest()[:32]


def _usable(tokens: list[TokenizedExample]) -> list[TokenizedExample]:
    return [t for t in tokens if t.n_response > 0]


def prepare(cfg: DataConfig, tokenizer, max_length: int) -> PreparedData:
    """Resolve groups, split the target, sample seeded previews of m usable examples, tokenise, validate."""
    target, candidates = resolve_groups(cfg)
    if any(g.name == TARGET_KEY for g in candidates):
        raise DataError(f"group name {TARGET_KEY!r} is reserved")
    warnings: list[str] = []
    train, val = split_target(target, cfg.val_fraction, cfg.seed)
    train_tok = _usable(tokenize_examples(tokenizer, train, max_length))
    val_tok = _usable(tokenize_examples(tokenizer, val, max_length))
    if not train_tok or not val_tok:
        raise DataError(f"target group {target.name!r} ({target.origin}) has no response tokens in its "
                        f"{'train' if not train_tok else 'validation'} split after formatting and truncation "
                        f"to model.max_length={max_length}: empty responses, or prompts longer than the context")
    m_tar = cfg.target_preview_size or cfg.preview_size
    idx = preview_indices(len(train_tok), m_tar, cfg.seed, TARGET_KEY)
    target_item = WorkItem(TARGET_KEY, tuple(train_tok[i] for i in idx))

    items, kept = [], []
    for g in candidates:
        # sample a preview, tokenise it, and replace unusable examples from the rest of the group
        order = sample_order(len(g.examples), cfg.seed, g.name)
        usable: list[TokenizedExample] = []
        dropped = 0
        for start in range(0, len(order), cfg.preview_size):
            chunk = [g.examples[i] for i in order[start : start + cfg.preview_size]]
            toks = tokenize_examples(tokenizer, chunk, max_length)
            good = _usable(toks)
            dropped += len(toks) - len(good)
            usable.extend(good)
            if len(usable) >= cfg.preview_size:
                break
        usable = usable[: cfg.preview_size]
        if not usable:
            raise DataError(f"candidate group {g.name!r} ({g.origin}) has no example with response tokens "
                            f"(empty responses, or prompts longer than model.max_length={max_length})")
        if dropped:
            warnings.append(f"group {g.name!r}: {dropped} example(s) without response tokens were not used")
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
        raise DataError("no candidate group is left to value")
    for w in warnings:
        log.warning(w)
    return PreparedData(target, train_tok, val_tok, target_item, kept, items, warnings)
