"""Group vectors (Ray-free; actors wrap it): mean SFT-loss gradients at theta_0 (lora_B or every weight), or task vectors."""

from __future__ import annotations

import inspect
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from convalue.engine.model.loading import autocast
from convalue.engine.model.tokenize import IGNORE, TokenizedExample

if TYPE_CHECKING:
    import torch

    from convalue.engine.features.projection import Projector


PREFIX_CACHE_SIZE = 4  # shared prefixes kept per featuriser (one per owner count a batch has)
PREFIX_CACHE_SHARE = 0.25  # ... holding at most this share of a batch's tokens (model.token_budget) in all


@dataclass(frozen=True)
class WorkItem:
    """One group's tokenised preview: the unit of work a gradient worker receives."""

    name: str
    examples: tuple[TokenizedExample, ...]


def block_tokens(block: list[WorkItem]) -> int:
    """Input tokens of a block of groups (its cost)."""
    return sum(len(e) for it in block for e in it.examples)


def plan_blocks(items: list[WorkItem], groups_per_call: int) -> list[list[WorkItem]]:
    """Blocks of groups_per_call groups, longest groups first: similar lengths pack tighter into token-budget
    batches, and sending the costliest blocks first balances the workers' tail."""
    order = sorted(items, key=lambda it: -block_tokens([it]))
    return [order[i : i + groups_per_call] for i in range(0, len(order), groups_per_call)]


def pad_batch(examples: list[TokenizedExample], pad_id: int):
    """Right-padded input_ids, attention_mask and labels tensors."""
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


def _decoder_and_head(model):
    """(decoder, lm_head) of a causal LM (through a PEFT wrapper), or None if logits need the full forward."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "final_logit_softcapping", None):
        return None
    try:
        decoder, head = base.get_decoder(), base.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    return (decoder, head) if decoder is not None and head is not None else None


def cache_keyword(decoder) -> str:
    """The decoder's keyword for a key/value cache: `cache` in transformers 5 (which drops `past_key_values` in
    5.40), `past_key_values` in 4.x."""
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


def per_row_mean(values, valid):
    """Per-example mean of token values given at the valid positions (row-major): a [B] tensor."""
    import torch

    rows = torch.nonzero(valid, as_tuple=True)[0]
    total = torch.zeros(valid.shape[0], dtype=values.dtype, device=values.device).index_add(0, rows, values)
    return total / valid.sum(dim=1).clamp(min=1)


def response_logits(model, ids, mask, labels):
    """(logits, targets, valid): the next-token logits at labelled positions only (valid: [B, L-1], row-major).

    The LM head (a vocabulary-sized matmul) is applied only where a label exists.
    """
    target = labels[:, 1:]
    valid = target != IGNORE
    parts = _decoder_and_head(model)
    if parts is None:
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1][valid]
    else:
        decoder, head = parts
        logits = head(decoder(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1][valid])
    return logits, target[valid], valid


def mean_token_ce(logits, target, valid):
    """Per-example mean cross-entropy from the logits and targets at the valid positions: a [B] tensor."""
    import torch

    return per_row_mean(torch.nn.functional.cross_entropy(logits.float(), target, reduction="none"), valid)


def per_example_loss(model, ids, mask, labels):
    """Mean token cross-entropy over each example's response tokens: a [B] tensor."""
    return mean_token_ce(*response_logits(model, ids, mask, labels))


def take_flat_grad(params: list) -> np.ndarray:
    """The accumulated .grad of params as one float32 vector (zeros where none arrived); clears .grad."""
    import torch

    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().reshape(-1)
                      for p in params]).cpu().numpy()
    for p in params:
        p.grad = None
    return flat


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


def prefix_forward(model, prefix_ids: tuple[int, ...], rows: int, device: str) -> list:
    """The shared prefix run through the decoder once for `rows` owners: [(keys, values)] per layer, with their graph."""
    import torch

    decoder, _ = _decoder_and_head(model)
    prefix = torch.tensor([prefix_ids] * rows, device=device)
    out = decoder(input_ids=prefix, attention_mask=torch.ones_like(prefix), use_cache=True)
    cache = out[cache_keyword(decoder)]
    return [(layer.keys, layer.values) for layer in cache.layers]


def shared_prefix_loss(model, examples: list[TokenizedExample], owners: list[int], P: int, pad_id: int,
                       device: str, runs: list[list[int]], prefix_kv: list):
    """Per-example losses of the suffixes after the first P tokens (shared_prefix_length), whose keys and values
    `prefix_kv` (leaves, one row per owner in sorted order) are expanded to each owner's examples.

    Returns (losses, prefix rows' owners); losses are in the order of the concatenated `runs` (index lists into
    examples, one decoder call each). Backward leaves each owner's prefix row the gradient summed over that
    owner's examples, which is exactly what a per-group mean needs.
    """
    import torch
    from transformers import DynamicCache

    decoder, head = _decoder_and_head(model)
    keyword = cache_keyword(decoder)
    groups = sorted(set(owners))
    row = {g: i for i, g in enumerate(groups)}
    losses = []
    for run in runs:
        select = torch.tensor([row[owners[i]] for i in run], device=device)
        expanded = DynamicCache()
        for i, (keys, values) in enumerate(prefix_kv):
            expanded.update(keys.index_select(0, select), values.index_select(0, select), i)
        suffix = [TokenizedExample(examples[i].input_ids[P:], examples[i].labels[P:]) for i in run]
        ids, mask, labels = (t.to(device) for t in pad_batch(suffix, pad_id))
        full_mask = torch.cat([torch.ones(len(run), P, dtype=mask.dtype, device=device), mask], dim=1)
        positions = (torch.arange(ids.shape[1], device=device) + P).expand(ids.shape[0], -1)
        hidden = decoder(input_ids=ids, attention_mask=full_mask, position_ids=positions, use_cache=True,
                         **{keyword: expanded}).last_hidden_state[:, :-1]
        target = labels[:, 1:]
        valid = target != IGNORE
        losses.append(mean_token_ce(head(hidden[valid]), target[valid], valid))
    return torch.cat(losses), groups


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


class PerExampleGradients:
    """Per-example gradients of the lora_B weights from one backward pass (forward input x grad-output hooks).

    For lora_B (a Linear r -> out, bias-free) with input h = A x and output gradient delta,
    d loss_b / d B = sum_t delta_{b,t}^T h_{b,t}: one einsum per module, no per-example backward.
    Forward calls are numbered in order; a kept call (a cached shared prefix) keeps its inputs across collects,
    and its grad hooks fire on every backward that reaches it.
    """

    def __init__(self, peft_model: torch.nn.Module, param_names: list[str]):
        self.modules = [peft_model.get_submodule(n.rsplit(".", 1)[0]) for n in param_names]
        self._inputs: list[dict[int, object]] = [{} for _ in self.modules]  # call number -> h
        self._grads: list[dict[int, object]] = [{} for _ in self.modules]  # call number -> delta
        self._calls = [0] * len(self.modules)
        self._handles = [mod.register_forward_hook(self._make_hook(k)) for k, mod in enumerate(self.modules)]

    def _make_hook(self, k: int):
        def hook(module, inputs, output):
            call = self._calls[k]  # every module sees each decoder call once, so the numbers agree across modules
            self._calls[k] += 1
            self._inputs[k][call] = inputs[0].detach()

            def grab(grad):
                self._grads[k][call] = grad.detach()

            output.register_hook(grab)

        return hook

    @property
    def next_call(self) -> int:
        """The number the next forward call gets."""
        return self._calls[0]

    def collect(self, calls: list[int], keep: set[int] = frozenset()) -> list:
        """[rows, d] gradients of the given forward calls (module order = parameter order); forgets every
        gradient, and the inputs of all calls outside `keep`."""
        import torch

        out = []
        for c in calls:
            parts = []
            for k, mod in enumerate(self.modules):
                h = self._inputs[k][c]
                g = self._grads[k].get(c)
                if g is None:  # no gradient reached this output (e.g. the last layer's prefix queries)
                    parts.append(torch.zeros(h.shape[0], mod.weight.numel(), device=h.device))
                    continue
                parts.append(torch.einsum("bto,btr->bor", g.float(), h.float()).reshape(h.shape[0], -1))
            out.append(torch.cat(parts, dim=1))
        for k in range(len(self.modules)):
            self._grads[k].clear()
            for c in [c for c in self._inputs[k] if c not in keep]:
                del self._inputs[k][c]
        return out

    def close(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()


@dataclass
class _CachedPrefix:
    """A shared prefix's keys and values at theta_0 with their graph (kept for later backwards)."""

    kv: list
    call: int  # its forward call's number in PerExampleGradients
    versions: tuple[int, ...]  # the parameters' in-place versions when it was computed


class GroupGradients:
    """Computes g = (1/m) sum_j grad l(x_j; theta_0) over the given parameters (lora_B, or every weight), then projects it."""

    def __init__(self, peft_model: torch.nn.Module, params: list[torch.nn.Parameter], projector: Projector,
                 pad_id: int, batch_size: int = 8, device: str = "cpu", autocast_dtype: torch.dtype | None = None, *,
                 param_names: list[str] | None = None,
                 token_budget: int | None = None, keep_per_example: bool = False, share_prefix: bool = True,
                 split_cost_tokens: int | None = None):
        self.model = peft_model.eval()  # eval: no dropout, deterministic
        self.params = params
        self.token_budget = token_budget
        self.share_prefix = share_prefix
        self.split_cost_tokens = split_cost_tokens
        self.keep_per_example = keep_per_example
        self.per_example: dict[str, np.ndarray] = {}
        self._hooks = PerExampleGradients(peft_model, param_names) if token_budget else None
        self.prefix_cache_size = PREFIX_CACHE_SIZE  # 0: recompute the shared prefix in every batch
        self._prefixes: OrderedDict[tuple, _CachedPrefix] = OrderedDict()
        self.projector = projector
        self.pad_id = pad_id
        self.batch_size = batch_size
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.tokens = 0
        self.seconds = 0.0

    @property
    def dim(self) -> int:
        """d: number of featurised parameters."""
        return sum(p.numel() for p in self.params)

    def _prefix(self, prefix_ids: tuple[int, ...], rows: int) -> _CachedPrefix:
        """The shared prefix's keys and values for `rows` owners: computed once, then reused while no parameter
        changes (the chat template's system prompt and user header are the same in every batch)."""
        versions = tuple(p._version for p in self.model.parameters())  # bumped by any in-place change
        key = (prefix_ids, rows)
        entry = self._prefixes.get(key)
        if entry is not None and entry.versions == versions:
            self._prefixes.move_to_end(key)
            return entry
        self._prefixes.pop(key, None)
        call = self._hooks.next_call
        entry = _CachedPrefix(prefix_forward(self.model, prefix_ids, rows, self.device), call, versions)
        limit = PREFIX_CACHE_SHARE * self.token_budget  # the activations kept stay a fraction of one batch's
        if self.prefix_cache_size > 0 and len(prefix_ids) * rows <= limit:
            self._prefixes[key] = entry
            while len(self._prefixes) > self.prefix_cache_size or sum(
                    len(ids) * n for ids, n in self._prefixes) > limit:
                self._prefixes.popitem(last=False)  # least recently used first; never the new entry
        return entry

    def raw_gradient(self, examples: tuple[TokenizedExample, ...]) -> np.ndarray:
        """The unprojected mean gradient (float32, length d)."""

        if not examples:
            raise ValueError("cannot take the gradient of an empty group")
        t0 = time.perf_counter()
        for p in self.params:
            p.grad = None
        m = len(examples)
        # sort by length so each batch pads little; the mean does not depend on order
        order = sorted(range(m), key=lambda i: len(examples[i]))
        for start in range(0, m, self.batch_size):
            batch = [examples[i] for i in order[start : start + self.batch_size]]
            ids, mask, labels = (t.to(self.device) for t in pad_batch(batch, self.pad_id))
            with autocast(self.device, self.autocast_dtype):
                loss = per_example_loss(self.model, ids, mask, labels).sum() / m
            loss.backward()
            self.tokens += int(mask.sum())
        flat = take_flat_grad(self.params)
        self.seconds += time.perf_counter() - t0
        return flat

    def packed_gradients(self, items: list[WorkItem]) -> tuple[np.ndarray, list[np.ndarray]]:
        """Group means (and per-example gradients) from token-budget batches mixing all groups' examples."""
        import torch

        t0 = time.perf_counter()
        flat = [(g, ex) for g, it in enumerate(items) for ex in it.examples]
        if not flat or any(not it.examples for it in items):
            raise ValueError("cannot take the gradient of an empty group")
        lengths = [len(ex) for _, ex in flat]
        if max(lengths) > self.token_budget:
            raise ValueError(f"an example of {max(lengths)} tokens exceeds the token budget {self.token_budget}")
        # group sums stay on the device: only [groups, d] crosses to the host, not [examples, d] per batch
        sums = torch.zeros(len(items), self.dim, device=self.device)
        per_example = [None] * len(flat)
        for batch in pack_by_tokens(lengths, self.token_budget):
            exs = [flat[i][1] for i in batch]
            owners = [flat[i][0] for i in batch]
            prefix = (shared_prefix_length(exs) if self.share_prefix and not self.keep_per_example
                      and len(batch) > 1 and _decoder_and_head(self.model) is not None else 0)
            share = prefix > 0
            runs = (length_runs([len(e) - prefix for e in exs], self.split_cost_tokens)
                    if self.split_cost_tokens is not None else [list(range(len(exs)))])
            with autocast(self.device, self.autocast_dtype):
                if share:
                    cached = self._prefix(tuple(exs[0].input_ids[:prefix]), len(set(owners)))
                    # fresh leaves: the suffixes' backward stops at them, one gradient row per owner
                    leaves = [(k.detach().requires_grad_(), v.detach().requires_grad_()) for k, v in cached.kv]
                    first = self._hooks.next_call
                    losses, prefix_owners = shared_prefix_loss(self.model, exs, owners, prefix, self.pad_id,
                                                               self.device, runs, leaves)
                else:
                    first = self._hooks.next_call
                    losses = torch.cat([per_example_loss(self.model, *(t.to(self.device) for t in pad_batch(
                        [exs[i] for i in run], self.pad_id))) for run in runs])
            losses.sum().backward()
            suffix_calls = list(range(first, self._hooks.next_call))
            if share:  # then the prefix's own backward, through its kept graph
                pairs = [(t, x.grad) for kv, xs in zip(cached.kv, leaves) for t, x in zip(kv, xs)
                         if t.requires_grad and x.grad is not None]  # layer 0's keys hold no LoRA: no graph
                if pairs:
                    torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs], retain_graph=True)
            calls = self._hooks.collect(([cached.call] if share else []) + suffix_calls,
                                        keep={e.call for e in self._prefixes.values()})
            for p in self.params:
                p.grad = None
            order = [i for run in runs for i in run]  # the examples' rows, run after run
            grads = torch.cat(calls[1:] if share else calls)
            sums.index_add_(0, torch.tensor([owners[i] for i in order], device=grads.device), grads)
            if share:  # each group's shared-prefix row carries that group's prefix contribution
                sums.index_add_(0, torch.tensor(prefix_owners, device=grads.device), calls[0])
            if self.keep_per_example:
                rows = grads.cpu().numpy()
                for row, i in enumerate(order):
                    per_example[batch[i]] = rows[row]
            self.tokens += sum(len(e) for e in exs)  # input tokens (a shared prefix is computed once)
        counts = torch.tensor([len(it.examples) for it in items], dtype=torch.float32)
        self.seconds += time.perf_counter() - t0
        groups = []
        if self.keep_per_example:
            pos = 0
            for it in items:
                groups.append(np.stack(per_example[pos : pos + len(it.examples)]))
                pos += len(it.examples)
        return (sums.cpu() / counts[:, None]).numpy(), groups

    def featurize(self, items: list[WorkItem]) -> np.ndarray:
        """Projected mean gradients of several groups: a [len(items), p] float32 block."""
        if self.token_budget:
            raw, per_example = self.packed_gradients(items)
            for it, X in zip(items, per_example):
                self.per_example[it.name] = self.projector.project(X)
        else:
            raw = np.stack([self.raw_gradient(it.examples) for it in items])
        return self.projector.project(raw)


class GroupTaskVectors:
    """Task vectors tau_i = theta_i - theta_0 over all LoRA parameters (A and B), paper Sec. 3.1.

    For each group: reset the adapter to its seeded initialisation (B = 0, so theta = theta_0),
    take `steps` AdamW steps on the group's preview alone (batches cycle through its examples in a
    fixed order; dropout off), read tau, and reset again, so no group sees another's updates.
    """

    def __init__(self, peft_model: torch.nn.Module, named_params: list[tuple[str, torch.nn.Parameter]],
                 projector: Projector, pad_id: int, *, steps: int, lr: float, batch_size: int, device: str = "cpu",
                 autocast_dtype: torch.dtype | None = None):
        self.model = peft_model.eval()
        self.autocast_dtype = autocast_dtype
        self.names = [n for n, _ in named_params]
        self.params = [p for _, p in named_params]
        self.init = [p.detach().clone() for p in self.params]
        self.projector = projector
        self.pad_id, self.steps, self.lr, self.batch_size, self.device = pad_id, steps, lr, batch_size, device
        self.tokens = 0
        self.seconds = 0.0

    @property
    def dim(self) -> int:
        """d: number of LoRA parameters."""
        return sum(p.numel() for p in self.params)

    def _reset(self) -> None:
        import torch

        with torch.no_grad():
            for p, p0 in zip(self.params, self.init):
                p.copy_(p0)
                p.grad = None

    def raw_vector(self, examples: tuple[TokenizedExample, ...]) -> np.ndarray:
        """tau for one group (float32, length d)."""
        import torch

        if not examples:
            raise ValueError("cannot take the task vector of an empty group")
        t0 = time.perf_counter()
        self._reset()
        opt = torch.optim.AdamW(self.params, lr=self.lr, weight_decay=0.0)
        order = sorted(range(len(examples)), key=lambda i: len(examples[i]))
        for step in range(self.steps):
            start = (step * self.batch_size) % len(order)
            idx = [order[(start + j) % len(order)] for j in range(min(self.batch_size, len(order)))]
            ids, mask, labels = (t.to(self.device) for t in pad_batch([examples[i] for i in idx], self.pad_id))
            with autocast(self.device, self.autocast_dtype):
                loss = per_example_loss(self.model, ids, mask, labels).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            self.tokens += int(mask.sum())
        tau = torch.cat([(p.detach() - p0).float().reshape(-1) for p, p0 in zip(self.params, self.init)])
        self._reset()
        self.seconds += time.perf_counter() - t0
        return tau.cpu().numpy()

    def featurize(self, items: list[WorkItem]) -> np.ndarray:
        """Projected task vectors of several groups: a [len(items), p] float32 block."""
        return self.projector.project(np.stack([self.raw_vector(it.examples) for it in items]))
