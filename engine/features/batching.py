"""How featurisation work is cut up: groups into blocks, examples into token-budget batches and length runs,
padded tensors, and the token prefix a batch shares."""

from __future__ import annotations

from typing import TYPE_CHECKING

from convalue.engine.data.tokenize import IGNORE, TokenizedExample, WorkItem

if TYPE_CHECKING:
    import torch




def block_tokens(block: list[WorkItem]) -> int:
    """Input tokens of a block of groups (its cost)."""
    return sum(len(e) for it in block for e in it.examples)


def plan_blocks(items: list[WorkItem], groups_per_call: int) -> list[list[WorkItem]]:
    """Blocks of groups_per_call groups, longest groups first: similar lengths pack tighter into token-budget
    batches, and sending the costliest blocks first balances the workers' tail."""
    order = sorted(items, key=lambda it: -block_tokens([it]))
    return [order[i : i + groups_per_call] for i in range(0, len(order), groups_per_call)]


def pad_batch(examples: list[TokenizedExample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input_ids, attention_mask and labels tensors."""
    # torch: only where a model runs; `convalue --help`/`status` import this module without it
    import torch

    L = max(len(e) for e in examples)
    ids = torch.full((len(examples), L), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), L), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), L), dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e)
        ids[i, :n] = torch.tensor(e.input_ids)
        labels[i, :n] = torch.tensor(e.labels)
        mask[i, :n] = 1
    return ids, mask, labels



def shared_prefix_length(examples: list[TokenizedExample], min_length: int = 8) -> int:
    """Longest common token prefix that ends before every example's first labelled position (0 if short)."""
    first = examples[0].input_ids
    limit = min(len(e) for e in examples) - 1
    for e in examples:
        labelled = next((i for i, lab in enumerate(e.labels) if lab != IGNORE), len(e))
        limit = min(limit, labelled - 1)
        k = 0
        while k < limit and e.input_ids[k] == first[k]:
            k += 1
        limit = k
    return limit if limit >= min_length else 0



def length_runs(lengths: list[int], overhead: int) -> list[list[int]]:
    """Indices split into runs of similar length (longest first), each run one padded call: the split that
    minimises padded tokens + `overhead` tokens per call (exact dynamic programme over the sorted lengths)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    n = len(order)
    # a cut between equal lengths never saves padding, so runs start only where the length changes:
    # O(distinct lengths^2), however many examples a batch holds
    cuts = [0] + [k for k in range(1, n) if lengths[order[k]] != lengths[order[k - 1]]] + [n]
    best, start = {0: 0}, {}
    for j in cuts[1:]:  # the last run is order[i:j]; its longest is order[i]
        best[j], start[j] = min((best[i] + (j - i) * lengths[order[i]] + overhead, i) for i in cuts if i < j)
    runs, j = [], n
    while j > 0:
        runs.append(order[start[j] : j])
        j = start[j]
    return runs[::-1]


def pack_by_tokens(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Indices grouped into batches, longest first, each with (count x longest length) <= token_budget."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]
        if current and (len(current) + 1) * longest > token_budget:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches
