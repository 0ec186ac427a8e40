"""The analysis commands' sections.

`faithfulness` (`convalue faithfulness`): every subset S of size k of the candidates (or a seeded sample) is
fine-tuned on the target plus S under the finetune section's fixed budget; u_FT(S) = L_val(target only) -
L_val(target + S) is compared with each representation's additive surrogate sum_{i in S} beta_i and KMM surrogate
sum_{i in S} beta_i - 1/2 sum_{i,j in S} K_ij (Spearman rho, its p-value, the top overlap).

`transfer` (`convalue transfer`): every group of the pool, the target included, is valued as the target against
all the others from one featurisation (row t: KMM on K of the others and beta = their inner products with group
t); then the positive/negative check for transfer.target: fine-tunes of it alone, with its positively scored
groups, and with those and its negatively scored ones.

Both commands fine-tune under the finetune section whatever finetune.enabled says (it switches a run's evaluation
on and off).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from convalue.engine.config.fields import ConfigError, opt


def _check_names(names: list[str] | None, field: str) -> None:
    """A list of group names: non-empty, no empty name, no name twice."""
    if names is None:
        return
    if not names:
        raise ConfigError("must list at least one group (or be null: every candidate)", field=field, value=names)
    if any(not n.strip() for n in names):
        raise ConfigError("must not hold an empty name", field=field, value=names)
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ConfigError(f"names {twice} more than once", field=field, value=names)


@dataclass(kw_only=True)
class FaithfulnessConfig:
    """`convalue faithfulness` (paper Tab. subset-faithfulness): k-subsets fine-tuned, u_FT against surrogates."""

    candidates: list[str] | None = opt(
        None, "The auxiliary groups whose subsets are enumerated (the paper: 8 languages); each must be a candidate "
        "group of the run. null: every candidate. The run still featurises every candidate of `data`.")
    k: int = opt(3, "Subset size (the paper: 3, so C(8, 3) = 56 subsets). Each subset is fine-tuned under the finetune "
                    "section's budget, whatever finetune.enabled says.")
    sample: int | None = opt(None, "Fine-tune a seeded sample of this many of the C(N, k) subsets (null: all of them). "
                                   "At least 3 subsets are needed for a rank correlation.")
    seed: int = opt(0, "Seed of `sample`.")
    top: int = opt(10, "The top-overlap's size: how many of the `top` subsets by u_FT are among the `top` by a "
                       "surrogate (the paper: 10).")
    normalize: Literal["cosine", "none"] = opt(
        "cosine", "`cosine`: the surrogates' K and beta of unit vectors, K_ij / sqrt(K_ii K_jj) and beta_i / "
        "(sqrt(K_ii) times the norm of g_tar), cosine similarities as the paper uses for One-Step and TV; `none`: the "
        "raw Gram.")

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value does not hold."""
        _check_names(self.candidates, "candidates")
        if self.k < 1:
            raise ConfigError("must be >= 1", field="k", value=self.k)
        if self.candidates is not None and self.k > len(self.candidates):
            raise ConfigError(f"is larger than the {len(self.candidates)} group(s) of faithfulness.candidates",
                              field="k", value=self.k)
        if self.sample is not None and self.sample < 3:
            raise ConfigError("must be >= 3 (a rank correlation needs 3 subsets), or null", field="sample",
                              value=self.sample)
        if self.top < 1:
            raise ConfigError("must be >= 1", field="top", value=self.top)

    def subsets_of(self, n: int) -> int:
        """How many subsets a pool of n candidates gives."""
        total = math.comb(n, self.k)
        return total if self.sample is None else min(total, self.sample)


@dataclass(kw_only=True)
class TransferConfig:
    """`convalue transfer` (paper Fig. pairwise_relation, Tab. zh_results): each group as the target in turn."""

    target: str | None = opt(None, "The group whose row gives the positive and negative sets (the paper: zh); the "
                                   "run's target or one of its candidates. null: the run's target.")
    gamma_ratio: float = opt(0.05, "gamma of each row's KMM solve as a fraction of the largest absolute beta_i of "
                                   "its (normalised) problem, the smallest gamma that zeroes every score (the paper: "
                                   "5e-2).")
    normalize: Literal["cosine", "none"] = opt("cosine", "The KMM normalisation of every row (as solver.normalize).")
    positive: int = opt(4, "The positive set: at most this many groups with the highest positive scores in the "
                           "target's row (the paper: 4).")
    negative: int = opt(4, "The negative set: at most this many groups with the lowest negative scores (the paper: "
                           "4).")
    check: bool = opt(True, "Fine-tune target only, target + positive set and target + positive + negative set "
                            "(the finetune section's budget, whatever finetune.enabled says) and report their "
                            "validation and training losses. false: the transfer matrix only.")

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value does not hold."""
        if self.target is not None and not self.target.strip():
            raise ConfigError("must be a group name (or null: the run's target)", field="target", value=self.target)
        if not (0.0 <= self.gamma_ratio < 1.0):
            raise ConfigError("must be in [0, 1)", field="gamma_ratio", value=self.gamma_ratio)
        for name in ("positive", "negative"):
            if getattr(self, name) < 0:
                raise ConfigError("must be >= 0", field=name, value=getattr(self, name))
        if self.check and self.positive == 0:
            raise ConfigError("must be >= 1 with check: true (the check compares the positive set with target "
                              "only)", field="positive", value=self.positive)
