"""Mean LoRA-B gradients on a tiny real Llama: batching-invariant, deterministic, a sketch of the full gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import chatterbot_pairs

from convalue.engine.config import LoraConfig
from convalue.engine.data.examples import Example
from convalue.engine.data.tokenize import tokenize_examples
from convalue.engine.features.batching import (
    WorkItem,
    block_tokens,
    length_runs,
    pack_by_tokens,
    pad_batch,
    plan_blocks,
    shared_prefix_length,
)
from convalue.engine.features.gradients import PREFIX_CACHE_SHARE, GroupGradients, PrefixForward
from convalue.engine.features.losses import per_example_loss
from convalue.engine.features.projection import make_projector
from convalue.engine.features.task_vectors import GroupTaskVectors
from convalue.engine.model.loading import attach_lora, load_model, load_tokenizer, lora_b_parameters


def build(model_dir, batch_size=4, proj=("identity", 0), lora=None):
    lora = lora or LoraConfig(r=4, alpha=8)
    model = load_model(model_dir)
    peft_model = attach_lora(model, lora, dropout=0.0)
    params = [p for _, p in lora_b_parameters(peft_model)]
    d = sum(p.numel() for p in params)
    return GroupGradients(peft_model, params, make_projector(proj[0], d, proj[1] or d, 0),
                          pad_id=load_tokenizer(model_dir).pad_token_id, batch_size=batch_size)


@pytest.fixture(scope="module")
def examples(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    exs = [Example((("user", r["prompt"]), ("assistant", r["response"]))) for r in chatterbot_pairs("spanish", 7)]
    return tuple(tokenize_examples(tok, exs, 64))


@pytest.fixture(scope="module")
def varied(tiny_model_dir):
    """The same chats untruncated: lengths 75 to 112, so length runs really cut."""
    tok = load_tokenizer(tiny_model_dir)
    exs = [Example((("user", r["prompt"]), ("assistant", r["response"]))) for r in chatterbot_pairs("spanish", 7)]
    return tuple(tokenize_examples(tok, exs, 160))


def test_mean_gradient_does_not_depend_on_batching(tiny_model_dir, examples):
    g1 = build(tiny_model_dir, batch_size=1).raw_gradient(examples)
    g3 = build(tiny_model_dir, batch_size=3).raw_gradient(examples)
    g7 = build(tiny_model_dir, batch_size=7).raw_gradient(examples)
    assert np.linalg.norm(g1) > 0
    np.testing.assert_allclose(g3, g1, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(g7, g1, rtol=1e-4, atol=1e-7)


def test_same_seeds_give_identical_projected_vectors(tiny_model_dir, examples):
    items = [WorkItem("a", examples[:3]), WorkItem("b", examples[3:])]
    a = build(tiny_model_dir, proj=("countsketch", 256)).featurize(items)
    b = build(tiny_model_dir, proj=("countsketch", 256)).featurize(items)
    assert a.shape == (2, 256)
    np.testing.assert_array_equal(a, b)


def test_lora_a_gradient_is_zero_and_b_gradient_sketches_the_full_gradient(tiny_model_dir, examples):
    """At B = 0: dL/dA = 0 exactly, and dL/dB = (alpha/r) dL/dW A^T for every adapted W."""
    lora = LoraConfig(r=4, alpha=8, target_modules=["q_proj"])
    base = load_model(tiny_model_dir)
    pad = load_tokenizer(tiny_model_dir).pad_token_id
    ids, mask, labels = pad_batch(list(examples[:4]), pad)
    per_example_loss(base, ids, mask, labels).mean().backward()
    full = {n: p.grad.clone() for n, p in base.named_parameters() if "q_proj" in n}
    peft_model = attach_lora(load_model(tiny_model_dir), lora, dropout=0.0)
    per_example_loss(peft_model, ids, mask, labels).mean().backward()
    named = dict(peft_model.named_parameters())
    checked = 0
    for n, p in named.items():
        if "lora_A" in n:
            assert torch.count_nonzero(p.grad) == 0
        if "lora_B" in n:
            layer = n.split("layers.")[1].split(".")[0]
            A = named[n.replace("lora_B", "lora_A")]
            W_grad = full[f"model.layers.{layer}.self_attn.q_proj.weight"]
            torch.testing.assert_close(p.grad, (lora.alpha / lora.r) * W_grad @ A.detach().T, rtol=1e-4, atol=1e-7)
            checked += 1
    assert checked == 2


def test_unknown_target_module_is_a_clear_error(tiny_model_dir):
    from convalue.engine.model.loading import ModelError

    with pytest.raises(ModelError, match=r"lora.target_modules \['qq_proj'\] not found"):
        attach_lora(load_model(tiny_model_dir), LoraConfig(target_modules=["qq_proj"]))


def _truncate(path):
    path.write_bytes(path.read_bytes()[:1000])


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "model.safetensors").unlink(), r"no weights in the folder"),
    (lambda d: _truncate(d / "model.safetensors"), r"model.safetensors: unreadable weights .* truncated or damaged"),
    (lambda d: ((d / "tokenizer.json").unlink(), (d / "tokenizer_config.json").unlink()), r"no usable tokenizer"),
    (lambda d: (d / "tokenizer_config.json").write_text('{"x":'), r"no usable tokenizer"),
])
def test_a_damaged_model_folder_is_refused_in_the_driver(tiny_model_dir, tmp_path, damage, message):
    """Missing or truncated weights and a missing tokenizer are ModelErrors before any worker starts."""
    import shutil

    from convalue.engine.config import ModelConfig
    from convalue.engine.model.loading import ModelError, resolve_model_dir

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    assert load_tokenizer(resolve_model_dir(ModelConfig(source=str(folder)))).is_fast  # the intact copy loads
    damage(folder)
    with pytest.raises(ModelError, match=message):
        load_tokenizer(resolve_model_dir(ModelConfig(source=str(folder))))


def test_pack_by_tokens_covers_everything_within_budget():
    lengths = [5, 30, 12, 12, 7, 30, 1, 22]
    batches = pack_by_tokens(lengths, 40)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 40 or len(b) == 1


def test_length_runs_minimise_padding_plus_calls():
    import itertools

    lengths = [30, 5, 29, 12, 12, 31, 6, 13]

    def cost(runs, overhead):
        return sum(len(r) * max(lengths[i] for i in r) + overhead for r in runs)

    for overhead in (0, 3, 10, 40, 10**9):
        runs = length_runs(lengths, overhead)
        assert sorted(i for r in runs for i in r) == list(range(len(lengths)))
        flat = [lengths[i] for r in runs for i in r]
        assert flat == sorted(lengths, reverse=True)  # contiguous runs of the longest-first order
        # exact: no split of the sorted order into contiguous runs costs less
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        best = min(cost([order[a:b] for a, b in zip((0,) + cut, cut + (len(order),))], overhead)
                   for k in range(len(order)) for cut in itertools.combinations(range(1, len(order)), k))
        assert cost(runs, overhead) == best
    assert len(length_runs(lengths, 10**9)) == 1
    assert len(length_runs(lengths, 0)) == len(set(lengths))


def test_plan_blocks_sends_the_longest_groups_first():
    from convalue.engine.data.tokenize import TokenizedExample

    def group(name, *lengths):
        return WorkItem(name, tuple(TokenizedExample((1,) * n, (1,) * n) for n in lengths))

    items = [group("a", 3), group("b", 10, 10), group("c", 5), group("d", 8, 1), group("e", 2)]
    blocks = plan_blocks(items, 2)
    assert [[it.name for it in b] for b in blocks] == [["b", "d"], ["c", "a"], ["e"]]
    assert [block_tokens(b) for b in blocks] == [29, 8, 2]


def _packed(model_dir, budget, keep=False, **kwargs):
    from convalue.engine.model.loading import lora_b_parameters

    model = load_model(model_dir)
    peft_model = attach_lora(model, LoraConfig(r=4, alpha=8), dropout=0.0)
    named = lora_b_parameters(peft_model)
    params = [p for _, p in named]
    d = sum(p.numel() for p in params)
    return GroupGradients(peft_model, params, make_projector("identity", d, d, 0),
                          pad_id=load_tokenizer(model_dir).pad_token_id, param_names=[n for n, _ in named],
                          token_budget=budget, keep_per_example=keep, **kwargs)


def test_packing_changes_no_group_vector(tiny_model_dir, examples):
    items = [WorkItem("a", examples[:3]), WorkItem("b", examples[3:4]), WorkItem("c", examples[4:])]
    loop = build(tiny_model_dir).featurize(items)
    for budget in (64, 200, 4096):  # from one example per batch to all groups in one batch
        packed = _packed(tiny_model_dir, budget).featurize(items)
        np.testing.assert_allclose(packed, loop, rtol=2e-4, atol=1e-7)


def test_per_example_gradients_sum_to_the_batch_gradient(tiny_model_dir, examples):
    g = _packed(tiny_model_dir, 4096, keep=True)
    g.featurize([WorkItem("all", examples)])
    per_example = g.per_example["all"]
    assert per_example.shape[0] == len(examples)
    batch_mean = build(tiny_model_dir, batch_size=len(examples)).raw_gradient(examples)
    np.testing.assert_allclose(per_example.mean(axis=0), batch_mean, rtol=2e-4, atol=1e-7)
    assert np.linalg.norm(per_example[0] - per_example[1]) > 0


def test_example_longer_than_budget_is_an_error(tiny_model_dir, examples):
    with pytest.raises(ValueError, match="exceeds the token budget 8"):
        _packed(tiny_model_dir, 8).featurize([WorkItem("a", examples)])


def _task_vectors(model_dir, steps=3, autocast_dtype=None):
    peft_model = attach_lora(load_model(model_dir), LoraConfig(r=4, alpha=8), dropout=0.0)
    named = lora_b_parameters(peft_model, with_a=True)
    d = sum(p.numel() for _, p in named)
    return GroupTaskVectors(peft_model, named, make_projector("identity", d, d, 0),
                            load_tokenizer(model_dir).pad_token_id, steps=steps, lr=1e-2, batch_size=2,
                            autocast_dtype=autocast_dtype)


def test_task_vectors_are_deterministic_and_reset_between_groups(tiny_model_dir, examples):
    a, b = WorkItem("a", examples[:3]), WorkItem("b", examples[3:])
    tv = _task_vectors(tiny_model_dir)
    both = tv.featurize([a, b])
    alone_b = _task_vectors(tiny_model_dir).featurize([b])
    np.testing.assert_allclose(both[1], alone_b[0], rtol=1e-5, atol=1e-8)  # b never saw a's updates
    np.testing.assert_array_equal(_task_vectors(tiny_model_dir).featurize([a, b]), both)
    n_a = sum(p.numel() for n, p in zip(tv.names, tv.params) if "lora_A" in n)
    assert np.linalg.norm(both[0][:n_a]) > 0 or np.linalg.norm(both[0][n_a:]) > 0
    # A moves too once B is non-zero after the first step (unlike the one-step gradient)
    a_part = np.concatenate([v for n, v in zip(tv.names, np.split(both[0], np.cumsum(
        [p.numel() for p in tv.params])[:-1])) if "lora_A" in n])
    assert np.abs(a_part).max() > 0
    assert all(torch.equal(p, p0) for p, p0 in zip(tv.params, tv.init))  # reset to theta_0 afterwards


def test_shared_prefix_is_used_and_changes_no_group_vector(tiny_model_dir, examples):
    assert shared_prefix_length(list(examples)) >= 8  # the chat template's system prompt + user header
    items = [WorkItem("a", examples[:4]), WorkItem("b", examples[4:])]
    shared = _packed(tiny_model_dir, 4096)
    plain = _packed(tiny_model_dir, 4096)
    plain.share_prefix = False
    np.testing.assert_allclose(shared.featurize(items), plain.featurize(items), rtol=2e-4, atol=1e-7)


@pytest.mark.parametrize("share_prefix", [True, False])
def test_length_runs_change_no_vector(tiny_model_dir, varied, share_prefix):
    assert len(length_runs([len(e) for e in varied], 0)) > 2  # the lengths differ: real cuts
    items = [WorkItem("a", varied[:4]), WorkItem("b", varied[4:])]
    one = _packed(tiny_model_dir, 4096)
    one.share_prefix = share_prefix
    X = one.featurize(items)
    for overhead in (0, 4):  # a forward per distinct length; a few runs
        cut = _packed(tiny_model_dir, 4096)
        cut.share_prefix, cut.split_cost_tokens = share_prefix, overhead
        np.testing.assert_allclose(cut.featurize(items), X, rtol=2e-4, atol=1e-7)


def test_length_runs_keep_rows_and_owners_in_order(tiny_model_dir, varied):
    items = [WorkItem("a", varied[:4]), WorkItem("b", varied[4:])]
    one = _packed(tiny_model_dir, 4096, keep=True)
    # one batch in the examples' own order (pack_by_tokens sorts it, which would hide a row mix-up)
    cut = _packed(tiny_model_dir, 4096, keep=True, pack=lambda lengths, budget: [list(range(len(lengths)))])
    X = one.featurize(items)
    for share in (False, True):  # per-example rows (no shared prefix), then group sums with the prefix
        cut.split_cost_tokens, cut.keep_per_example, cut.share_prefix = 0, not share, share
        np.testing.assert_allclose(cut.featurize(items), X, rtol=2e-4, atol=1e-7)
        if not share:
            for it in items:
                np.testing.assert_allclose(cut.per_example[it.name], one.per_example[it.name], rtol=2e-4, atol=1e-7)


def test_bf16_autocast_reaches_the_task_vector_steps(tiny_model_dir, examples):
    """The autocast of a CUDA replica with model.dtype bfloat16, run here on the CPU: rounding, nothing more."""
    from convalue.engine.model.loading import autocast_dtype

    assert autocast_dtype("cuda:0", "bfloat16") is torch.bfloat16
    assert autocast_dtype("cpu", "bfloat16") is None and autocast_dtype("cuda", "float32") is None
    item = [WorkItem("a", examples[:4])]
    fp32 = _task_vectors(tiny_model_dir).featurize(item)[0]
    bf16 = _task_vectors(tiny_model_dir, autocast_dtype=torch.bfloat16).featurize(item)[0]
    assert not np.array_equal(bf16, fp32)  # the steps did run under autocast
    cos = float(bf16 @ fp32 / (np.linalg.norm(bf16) * np.linalg.norm(fp32)))
    assert cos > 0.99, cos


def _counted_prefix_forward() -> tuple[list[int], PrefixForward]:
    """(rows of every shared prefix computed, a prefix_forward for GroupGradients that records them)."""
    from convalue.engine.features.losses import prefix_forward

    computed: list[int] = []

    def counted(model, ids, rows, device):
        computed.append(rows)
        return prefix_forward(model, ids, rows, device)

    return computed, counted


def _owner_counts(examples, budget: int, split: tuple[int, int]) -> list[int]:
    """Groups per shared-prefix batch when groups are examples[:split[0]], [split[0]:split[1]], [split[1]:]."""
    batches = pack_by_tokens([len(e) for e in examples], budget)
    return [len({sum(i >= s for s in split) for i in b}) for b in batches if len(b) > 1]


def test_shared_prefix_is_kept_across_batches_and_calls_until_the_weights_change(tiny_model_dir, examples):
    computed, counted = _counted_prefix_forward()
    items = [WorkItem("a", examples[:3]), WorkItem("b", examples[3:5]), WorkItem("c", examples[5:])]
    budget = 256  # two batches, {a, b} and {b, c}: the second reuses the first's prefix
    assert _owner_counts(examples, budget, (3, 5)) == [2, 2]
    cached, plain = _packed(tiny_model_dir, budget, prefix_forward=counted), _packed(tiny_model_dir, budget)
    plain.share_prefix = False
    X = cached.featurize(items)
    assert computed == [2]  # the second batch reused the first's
    (ids, rows), = cached._prefixes  # kept, within its share of the budget
    assert rows == 2 and 2 * len(ids) <= PREFIX_CACHE_SHARE * budget
    np.testing.assert_array_equal(cached.featurize(items), X)  # a second call recomputes nothing
    assert computed == [2]
    np.testing.assert_allclose(X, plain.featurize(items), rtol=2e-4, atol=1e-7)
    with torch.no_grad():  # an in-place change to the weights makes the kept prefix stale
        for g in (cached, plain):
            g.params[0].add_(0.05)
    Y = cached.featurize(items)
    assert computed == [2, 2]
    np.testing.assert_allclose(Y, plain.featurize(items), rtol=2e-4, atol=1e-7)
    assert not np.allclose(Y, X, rtol=1e-3)


def test_shared_prefix_too_large_to_keep_is_recomputed(tiny_model_dir, examples):
    computed, counted = _counted_prefix_forward()
    items = [WorkItem("a", examples[:3]), WorkItem("b", examples[3:5]), WorkItem("c", examples[5:])]
    budget = 160  # 2-example batches; one prefix row fits in a quarter of the budget, two do not
    assert _owner_counts(examples, budget, (3, 5)) == [1, 2, 2]
    small = _packed(tiny_model_dir, budget, prefix_forward=counted)
    X = small.featurize(items)
    assert computed == [1, 2, 2] and [rows for _, rows in small._prefixes] == [1]
    np.testing.assert_array_equal(small.featurize(items), X)
    assert computed == [1, 2, 2, 2, 2]
