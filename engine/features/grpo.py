"""GRPO group vectors (paper Sec. 3.1): the mean gradient at theta_0 of the GRPO surrogate loss.

For each prompt q of a group's preview, G completions o_1..o_G are sampled from pi_theta0 with HF
generate, scored by the reward function, and given group-relative advantages
A_j = (r_j - mean(r)) / (std(r) + eps). The per-prompt surrogate (Shao et al. 2024, eq. 3) is

    L(q) = -(1/G) sum_j (1/|o_j|) sum_t [ rho_jt A_j - kl_coef * KL_jt ],
    rho_jt = pi_theta(o_jt | .) / pi_theta_old(o_jt | .),  KL_jt = r - log r - 1 with r = pi_ref / pi_theta,

with log pi taken under the sampling policy (logits / temperature, as TRL's GRPO trainer does), and
the group vector is the mean over prompts of grad L(q) at theta = theta_old = theta_ref = theta_0.
There rho = 1 with gradient grad log pi, and the k3 KL term and its gradient are exactly zero; it is
still evaluated, so the loss is the full GRPO objective and not a special case written by hand.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from convalue.engine.data.tokenize import IGNORE, PromptExample, TokenizedExample, WorkItem
from convalue.engine.features.batching import pad_batch
from convalue.engine.features.gradients import take_flat_grad
from convalue.engine.features.losses import per_row_mean, response_logits
from convalue.engine.features.rewards import RewardError, load_reward, score
from convalue.engine.model.loading import autocast

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from convalue.engine.features.projection import Projector

ADV_EPS = 1e-4


class GrpoError(ValueError):
    """A GRPO featurisation problem (no completions, a failing reward), naming the group and prompt."""


def advantages(rewards: np.ndarray) -> np.ndarray:
    """Group-relative advantages (r - mean r) / (std r + eps); all zero when every reward is equal."""
    r = np.asarray(rewards, dtype=np.float64)
    return (r - r.mean()) / (r.std() + ADV_EPS)


def surrogate_loss(logp: torch.Tensor, ref_logp: torch.Tensor, adv: torch.Tensor, weight: torch.Tensor,
                   valid: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """-sum_j weight_j mean_t [exp(logp - logp.detach()) A_j - kl_coef * k3(ref_logp - logp)] (a scalar tensor).

    logp, ref_logp: token log-probabilities at the valid positions (row-major); adv, weight: per row [R];
    valid: [R, L]. weight_j = 1/G gives one prompt's GRPO loss.
    """
    # torch: only where a model runs; `convalue --help`/`status` import this module without it
    import torch

    rows = torch.nonzero(valid, as_tuple=True)[0]
    ratio = torch.exp(logp - logp.detach())
    log_r = ref_logp - logp
    kl = torch.exp(log_r) - log_r - 1
    per_token = ratio * adv[rows] - kl_coef * kl
    return -(per_row_mean(per_token, valid) * weight).sum()


def token_logprobs(logits: torch.Tensor, target: torch.Tensor, temperature: float) -> torch.Tensor:
    """log pi(o_t | .) of the sampled tokens under the sampling policy (logits / temperature, as TRL's GRPO)."""
    # torch: only where a model runs; `convalue --help`/`status` import this module without it
    import torch

    return torch.log_softmax(logits.float() / temperature, dim=-1).gather(1, target[:, None])[:, 0]


def generate_completions(model: torch.nn.Module, prompts: Sequence[PromptExample], *, generations: int, room: int,
                         temperature: float, top_p: float, pad_id: int, eos_id: int, seed: int, device: str = "cpu",
                         autocast_dtype: torch.dtype | None = None) -> list[list[tuple[int, ...]]]:
    """G completions per prompt of at most `room` new tokens (token ids through the first end-of-sequence), from one
    seeded, left-padded generate call in eval mode (the model's train/eval mode is restored)."""
    # torch: only where a model runs; `convalue --help`/`status` import this module without it
    import torch

    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, longest - len(p):] = torch.tensor(p.input_ids)
        mask[i, longest - len(p):] = 1
    was_training = model.training
    model.eval()
    devices = [torch.device(device)] if device.startswith("cuda") else []
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad(), autocast(device, autocast_dtype):
            torch.manual_seed(seed)
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=True,
                                 temperature=temperature, top_p=top_p, top_k=0, max_new_tokens=room,
                                 num_return_sequences=generations, pad_token_id=pad_id, eos_token_id=eos_id)
    finally:
        model.train(was_training)
    completions: list[list[tuple[int, ...]]] = [[] for _ in prompts]
    for r, row in enumerate(out[:, longest:].tolist()):  # rows are prompt-major: G per prompt
        cut = row.index(eos_id) + 1 if eos_id in row else len(row)
        completions[r // generations].append(tuple(row[:cut]))
    return completions


def surrogate_rows(prompts: Sequence[PromptExample], completions: Sequence[Sequence[tuple[int, ...]]],
                   rewards: Sequence[np.ndarray]) -> tuple[list[TokenizedExample], list[float], list[float]]:
    """(rows, advantages, weights) of the GRPO surrogate: each non-empty completion after its prompt, its
    group-relative advantage, and a weight that makes the loss the mean over a prompt's completions and over
    prompts."""
    rows, adv, weight = [], [], []
    for prompt, sampled, r in zip(prompts, completions, rewards):
        a = advantages(np.asarray(r, np.float64))
        kept = [j for j, c in enumerate(sampled) if c]
        for j in kept:
            rows.append(TokenizedExample(prompt.input_ids + sampled[j], (IGNORE,) * len(prompt) + sampled[j]))
            adv.append(a[j])
            weight.append(1.0 / (len(prompts) * len(kept)))
    return rows, adv, weight


class GroupGrpoGradients:
    """Mean GRPO surrogate gradient of each group over `params` (lora_B, or every weight), then projected."""

    def __init__(self, model: torch.nn.Module, params: list[torch.nn.Parameter], projector: Projector,
                 tokenizer: PreTrainedTokenizerBase, *, reward: str, generations: int, max_new_tokens: int,
                 temperature: float, top_p: float, kl_coef: float, seed: int, max_length: int, device: str = "cpu",
                 autocast_dtype: torch.dtype | None = None):
        self.model = model.eval()
        self.autocast_dtype = autocast_dtype
        self.params = params
        self.projector = projector
        self.tokenizer = tokenizer
        try:
            self.reward = load_reward(reward)
        except RewardError as exc:
            raise GrpoError(str(exc)) from None
        self.G, self.max_new_tokens, self.temperature, self.top_p = generations, max_new_tokens, temperature, top_p
        self.kl_coef, self.seed, self.max_length, self.device = kl_coef, seed, max_length, device
        self.pad_id = tokenizer.pad_token_id
        self.eos_id = tokenizer.eos_token_id
        self.tokens = 0
        self.seconds = 0.0
        self.stats = {"prompts": 0, "zero_advantage_prompts": 0, "reward_sum": 0.0}  # of the last featurize call

    @property
    def dim(self) -> int:
        """d: number of featurised parameters."""
        return sum(p.numel() for p in self.params)

    def sample(self, group: str, prompts: tuple[PromptExample, ...]) -> list[list[tuple[int, ...]]]:
        """G completions per prompt (token ids through the first end-of-sequence), all prompts of a group in one
        left-padded generate call, seeded by the group's name (none for no prompts: surrogate_gradient refuses
        an empty group, and a prompt without completion tokens)."""
        if not prompts:
            return []
        longest = max(len(p) for p in prompts)
        room = min(self.max_new_tokens, self.max_length - longest)
        if room <= 0:
            index = max(range(len(prompts)), key=lambda i: len(prompts[i]))
            raise GrpoError(f"group {group!r} prompt {index}: {longest} prompt tokens leave no room to generate "
                            f"within model.max_length={self.max_length}")
        return generate_completions(self.model, prompts, generations=self.G, room=room,
                                    temperature=self.temperature, top_p=self.top_p, pad_id=self.pad_id,
                                    eos_id=self.eos_id, seed=zlib.crc32(f"{self.seed}/{group}".encode()),
                                    device=self.device, autocast_dtype=self.autocast_dtype)

    def raw_gradient(self, item: WorkItem) -> np.ndarray:
        """The unprojected mean surrogate gradient of one group (float32, length d), from its own samples."""
        return self.surrogate_gradient(item, self.sample(item.name, item.examples))

    def surrogate_gradient(self, item: WorkItem, completions: list[list[tuple[int, ...]]]) -> np.ndarray:
        """The unprojected mean surrogate gradient of one group given G completions per prompt (as from sample)."""
        # torch: only where a model runs; `convalue --help`/`status` import this module without it
        import torch

        prompts = item.examples
        if not prompts:
            raise GrpoError(f"group {item.name!r} has no prompts")
        if len(completions) != len(prompts):
            raise GrpoError(f"group {item.name!r}: {len(completions)} completion lists for {len(prompts)} prompts")
        for index, sampled in enumerate(completions):
            if not any(sampled):
                raise GrpoError(f"group {item.name!r} prompt {index}: no completion tokens")
        rewards = []
        for index, (prompt, sampled) in enumerate(zip(prompts, completions)):
            texts = [self.tokenizer.decode(c, skip_special_tokens=True) for c in sampled]
            where = f"group {item.name!r} prompt {index}"
            rewards.append(np.array([score(self.reward, t, prompt.reference, where) for t in texts]))
            self.stats["prompts"] += 1
            self.stats["reward_sum"] += float(rewards[-1].mean())
            self.stats["zero_advantage_prompts"] += int(np.ptp(rewards[-1]) == 0)
        rows, adv, weight = surrogate_rows(prompts, completions, rewards)
        for p in self.params:
            p.grad = None
        step = self.G * 4
        for start in range(0, len(rows), step):
            ids, mask, labels = (t.to(self.device) for t in pad_batch(rows[start:start + step], self.pad_id))
            with autocast(self.device, self.autocast_dtype):
                logits, target, valid = response_logits(self.model, ids, mask, labels)
                logp = token_logprobs(logits, target, self.temperature)
            # featurisation is at theta_0 (LoRA B = 0, or the untouched base): pi_ref = pi_old = pi_theta
            chunk = slice(start, start + step)
            loss = surrogate_loss(logp, logp.detach(), torch.tensor(adv[chunk], dtype=torch.float32, device=self.device),
                                  torch.tensor(weight[chunk], dtype=torch.float32, device=self.device), valid, self.kl_coef)
            loss.backward()
            self.tokens += int(mask.sum())
        return take_flat_grad(self.params)

    def featurize(self, items: list[WorkItem]) -> np.ndarray:
        """Projected GRPO gradients of several groups: a [len(items), p] float32 block."""
        t0 = time.perf_counter()
        self.stats = dict.fromkeys(self.stats, 0)
        raw = np.stack([self.raw_gradient(it) for it in items])
        self.seconds += time.perf_counter() - t0
        return self.projector.project(raw)
