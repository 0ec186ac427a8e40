"""Group gradients at theta_0 (Ray-free; actors wrap it): the mean SFT-loss gradient of each group over lora_B or
every weight, one group at a time or packed in token-budget batches with per-example gradients, then projected."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from convalue.engine.data.tokenize import TokenizedExample
from convalue.engine.features.batching import (
    WorkItem,
    length_runs,
    pack_by_tokens,
    pad_batch,
    shared_prefix_length,
)
from convalue.engine.features.losses import (
    decoder_and_head,
    per_example_loss,
    prefix_forward,
    shared_prefix_loss,
)
from convalue.engine.model.loading import autocast

if TYPE_CHECKING:
    import torch

    from convalue.engine.features.projection import Projector


PREFIX_CACHE_SIZE = 4  # shared prefixes kept per featuriser (one per owner count a batch has)
PREFIX_CACHE_SHARE = 0.25  # ... holding at most this share of a batch's tokens (model.token_budget) in all
#: how packed featurisation cuts examples into batches: (lengths, token budget) -> lists of example indices
Pack = Callable[[list[int], int], list[list[int]]]
#: how a shared prefix's keys and values are computed: (model, prefix ids, rows, device) -> [(keys, values)] per layer
PrefixForward = Callable[["torch.nn.Module", tuple[int, ...], int, str], list]


def take_flat_grad(params: list[torch.nn.Parameter]) -> np.ndarray:
    """The accumulated .grad of params as one float32 vector (zeros where none arrived); clears .grad."""
    # torch: only where a model runs; `convalue --help`/`status` import this module without it
    import torch

    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().reshape(-1)
                      for p in params]).cpu().numpy()
    for p in params:
        p.grad = None
    return flat


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

    def collect(self, calls: list[int], keep: set[int] | frozenset[int] = frozenset()) -> list[torch.Tensor]:
        """[rows, d] gradients of the given forward calls (module order = parameter order); forgets every
        gradient, and the inputs of all calls outside `keep`."""
        # torch: only where a model runs; `convalue --help`/`status` import this module without it
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
    """Computes g = (1/m) sum_j grad l(x_j; theta_0) over the given parameters (lora_B, or every weight), then projects it.

    With a token_budget, `pack` cuts the examples of a block into batches (default: pack_by_tokens, longest first)
    and `prefix_forward` computes the keys and values of a prefix the batch's examples share (default: the decoder's
    forward, losses.prefix_forward).
    """

    def __init__(self, peft_model: torch.nn.Module, params: list[torch.nn.Parameter], projector: Projector,
                 pad_id: int, batch_size: int = 8, device: str = "cpu", autocast_dtype: torch.dtype | None = None, *,
                 param_names: list[str] | None = None,
                 token_budget: int | None = None, keep_per_example: bool = False, share_prefix: bool = True,
                 split_cost_tokens: int | None = None, pack: Pack = pack_by_tokens,
                 prefix_forward: PrefixForward = prefix_forward):
        self.model = peft_model.eval()  # eval: no dropout, deterministic
        self.pack = pack
        self.prefix_forward = prefix_forward
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
        entry = _CachedPrefix(self.prefix_forward(self.model, prefix_ids, rows, self.device), call, versions)
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
        # torch: only where a model runs; `convalue --help`/`status` import this module without it
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
        for batch in self.pack(lengths, self.token_budget):
            exs = [flat[i][1] for i in batch]
            owners = [flat[i][0] for i in batch]
            prefix = (shared_prefix_length(exs) if self.share_prefix and not self.keep_per_example
                      and len(batch) > 1 and decoder_and_head(self.model) is not None else 0)
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
