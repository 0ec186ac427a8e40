"""GRPO, full-parameter gradients, the diagonal-Fisher metric and the mathematics source on a tiny real Llama."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import chatterbot_pairs

from convalue.engine.config import (
    ConfigError,
    DataConfig,
    FeaturesConfig,
    FinetuneConfig,
    LoraConfig,
    ModelConfig,
    ProjectionConfig,
    SourceConfig,
    config_from_dict,
)
from convalue.engine.data.examples import DataError, Example
from convalue.engine.data.prepare import prepare
from convalue.engine.data.sources import load_source
from convalue.engine.data.tokenize import (
    IGNORE,
    PromptExample,
    TokenizedExample,
    WorkItem,
    tokenize_examples,
    tokenize_prompt,
)
from convalue.engine.features.batching import pad_batch
from convalue.engine.features.grpo import GrpoError, advantages, surrogate_loss
from convalue.engine.features.losses import per_example_loss, response_logits
from convalue.engine.features.rewards import (
    RewardError,
    load_reward,
    numeric_closeness,
    numeric_exact_match,
)
from convalue.engine.model.loading import load_model, load_tokenizer
from convalue.engine.model.spec import ReplicaSpec
from convalue.engine.selection.gram import diag_fisher_vectors

REWARDS = Path(__file__).parent / "rewards_for_tests.py"


def spec_for(model_dir: Path, split_cost_tokens: int | None = None, **features) -> ReplicaSpec:
    """A replica spec of the tiny model: identity projection, LoRA r = 4, packed batches of 1024 tokens."""
    tok = load_tokenizer(model_dir)
    return ReplicaSpec(model_dir=str(model_dir), model=ModelConfig(source=str(model_dir), max_length=96, batch_size=4,
                                                                   token_budget=1024,
                                                                   split_cost_tokens=split_cost_tokens),
                       lora=LoraConfig(r=4, alpha=8), features=FeaturesConfig(**features),
                       projection=ProjectionConfig(kind="identity", dim=1, seed=0), finetune=FinetuneConfig(),
                       pad_id=tok.pad_token_id)


@pytest.fixture(scope="module")
def prompts(tiny_model_dir) -> tuple[PromptExample, ...]:
    tok = load_tokenizer(tiny_model_dir)
    rows = [("What is 7 + 5?", "12"), ("Calculate 3*4.", "#### 12"), ("What is 10 - 3?", "7")]
    return tuple(tokenize_prompt(tok, Example((("user", q), ("assistant", a)))) for q, a in rows)


# --- rewards and advantages -------------------------------------------------------------------------------


def test_numeric_rewards():
    assert numeric_exact_match("so the answer is 1,234.", "1234") == 1.0
    assert numeric_exact_match("x = -3.50", "Solve ... #### -3.5") == 1.0
    assert numeric_exact_match("7/12", "The probability is 7/12") == 1.0
    assert numeric_exact_match("12 then 13", "12") == 0.0  # the last number counts
    assert numeric_exact_match("no idea", "12") == 0.0
    with pytest.raises(RewardError, match="no numeric final answer"):
        numeric_exact_match("12", "True")
    assert numeric_closeness("12", "12") == 1.0
    assert 0 < numeric_closeness("13", "12") < numeric_closeness("12.5", "12") < 0.5
    assert numeric_closeness("none", "12") == 0.0


def test_load_reward_by_name_file_and_module(tmp_path, monkeypatch):
    (tmp_path / "broken_reward_module.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "broken_reward_file.py").write_text("def f(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_reward("numeric_exact_match") is numeric_exact_match
    assert load_reward(f"{REWARDS}:length")("abc", "") == 3.0
    assert load_reward("convalue.engine.features.rewards:numeric_closeness") is numeric_closeness
    for spec, msg in [("nope", "unknown reward"), (f"{REWARDS}:absent", "no function"),
                      ("/no/such.py:f", "does not exist"), ("no_such_module_x:f", "cannot be imported"),
                      ("broken_reward_module:f", "cannot be imported: RuntimeError: boom at import"),
                      (f"{tmp_path / 'broken_reward_file.py'}:f", "failed to import: SyntaxError")]:
        with pytest.raises(RewardError, match=msg):
            load_reward(spec)
    with pytest.raises(ConfigError, match="features.grpo_reward") as err:
        config_from_dict({"data": {"target": {"kind": "chatterbot", "include": ["marathi"]},
                                   "candidates": [{"kind": "chatterbot"}]},
                          "features": {"representation": "grpo", "grpo_reward": "nope"}})
    assert "unknown reward" in str(err.value)


def test_advantages_are_group_relative():
    a = advantages(np.array([1.0, 0.0, 0.0, 1.0]))
    assert abs(a.sum()) < 1e-12 and a[0] > 0 > a[1]
    np.testing.assert_array_equal(advantages(np.array([0.5, 0.5, 0.5])), 0.0)


# --- GRPO featurisation -------------------------------------------------------------------------------------


def test_grpo_surrogate_gradient_is_the_advantage_weighted_policy_gradient(tiny_model_dir, prompts):
    """At theta_0, grad L = -sum_j w_j A_j grad mean_t log pi(o_jt), and the KL term adds exactly nothing."""
    from convalue.engine.features.replica import build_featurizer

    f = build_featurizer(spec_for(tiny_model_dir, representation="grpo", grpo_generations=3,
                                  grpo_max_new_tokens=6, grpo_reward=f"{REWARDS}:length"))
    completions = f.sample("g", prompts[:1])[0]
    P = len(prompts[0])
    toks = [TokenizedExample(prompts[0].input_ids + c, (IGNORE,) * P + c) for c in completions]
    ids, mask, labels = pad_batch(toks, f.pad_id)
    adv = torch.tensor([1.0, -0.5, -0.5])
    weight = torch.full((3,), 1 / 3)

    def grad_of(kl: float | None):
        for p in f.params:
            p.grad = None
        logits, target, valid = response_logits(f.model, ids, mask, labels)
        logp = torch.log_softmax(logits / f.temperature, -1).gather(1, target[:, None])[:, 0]
        if kl is None:  # the textbook policy gradient, written independently
            rows_ = torch.nonzero(valid, as_tuple=True)[0]
            per_row = torch.zeros(3).index_add(0, rows_, logp) / valid.sum(1)
            (-(weight * adv * per_row).sum()).backward()
        else:
            surrogate_loss(logp, logp.detach(), adv, weight, valid, kl).backward()
        return torch.cat([p.grad.reshape(-1) for p in f.params]).clone()

    reference = grad_of(None)
    assert reference.norm() > 0
    torch.testing.assert_close(grad_of(0.0), reference, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(grad_of(0.5), reference, rtol=1e-5, atol=1e-8)


def test_grpo_vectors_are_deterministic_and_nonzero(tiny_model_dir, prompts):
    from convalue.engine.features.replica import build_featurizer

    spec = spec_for(tiny_model_dir, representation="grpo", grpo_generations=3, grpo_max_new_tokens=8,
                    grpo_reward=f"{REWARDS}:length")
    items = [WorkItem("a", prompts[:2]), WorkItem("b", prompts[1:])]
    f = build_featurizer(spec)
    X = f.featurize(items)
    assert X.shape == (2, f.dim) and np.all(np.linalg.norm(X, axis=1) > 0)
    assert f.stats["prompts"] == 4 and f.stats["zero_advantage_prompts"] == 0
    np.testing.assert_array_equal(build_featurizer(spec).featurize(items), X)


def test_grpo_gradient_is_its_samples_surrogate_and_survives_bf16_autocast(tiny_model_dir, prompts):
    """raw_gradient = surrogate_gradient on sample's completions; bf16 autocast on the same completions only rounds."""
    from convalue.engine.features.replica import build_featurizer

    f = build_featurizer(spec_for(tiny_model_dir, representation="grpo", grpo_generations=3, grpo_max_new_tokens=8,
                                  grpo_reward=f"{REWARDS}:length"))
    item = WorkItem("a", prompts[:2])
    completions = f.sample(item.name, item.examples)
    fp32 = f.surrogate_gradient(item, completions)
    np.testing.assert_array_equal(f.raw_gradient(item), fp32)
    f.autocast_dtype = torch.bfloat16  # what build_featurizer gives a CUDA replica with model.dtype bfloat16
    bf16 = f.surrogate_gradient(item, completions)
    assert not np.array_equal(bf16, fp32)
    assert float(bf16 @ fp32 / (np.linalg.norm(bf16) * np.linalg.norm(fp32))) > 0.99
    with pytest.raises(GrpoError, match="group 'b': 2 completion lists for 1 prompts"):
        f.surrogate_gradient(WorkItem("b", prompts[:1]), completions)
    for take in (lambda it: f.surrogate_gradient(it, []), f.raw_gradient):
        with pytest.raises(GrpoError, match="group 'c' has no prompts"):
            take(WorkItem("c", ()))
    with pytest.raises(GrpoError, match="group 'a' prompt 1: no completion tokens"):
        f.surrogate_gradient(item, [completions[0], [()] * 3])


def test_grpo_errors_name_group_and_prompt(tiny_model_dir, prompts):
    from convalue.engine.features.replica import build_featurizer

    f = build_featurizer(spec_for(tiny_model_dir, representation="grpo", grpo_max_new_tokens=4,
                                  grpo_reward=f"{REWARDS}:broken"))
    with pytest.raises(RewardError, match=r"group 'a' prompt 0: reward function 'broken' raised ValueError: boom"):
        f.featurize([WorkItem("a", prompts[:1])])
    long_prompt = PromptExample(tuple(prompts[0].input_ids) * 20, "12")
    g = build_featurizer(spec_for(tiny_model_dir, representation="grpo", grpo_reward=f"{REWARDS}:length"))
    with pytest.raises(GrpoError, match="group 'b' prompt 0: .* no room to generate"):
        g.featurize([WorkItem("b", (long_prompt,))])
    with pytest.raises(GrpoError, match="no prompts"):
        g.featurize([WorkItem("c", ())])
    zero = build_featurizer(spec_for(tiny_model_dir, representation="grpo", grpo_max_new_tokens=4,
                                     grpo_reward=f"{REWARDS}:constant")).featurize([WorkItem("d", prompts)])
    assert not zero.any()  # equal rewards: no signal (the pipeline refuses such a group with an explanation)


def test_prepare_rejects_groups_longer_than_the_context(tiny_model_dir, tmp_path):
    from conftest import write_jsonl

    tok = load_tokenizer(tiny_model_dir)
    long_rows = [{"prompt": "word " * 200, "response": "12", "group": "long"} for _ in range(3)]
    ok_rows = [r | {"group": "ok"} for r in chatterbot_pairs("english", 4)]
    pool = write_jsonl(tmp_path / "pool.jsonl", long_rows + ok_rows)
    target = write_jsonl(tmp_path / "t.jsonl", chatterbot_pairs("marathi", 8))
    cfg = DataConfig(target=SourceConfig(kind="jsonl", path=str(target)),
                     candidates=[SourceConfig(kind="jsonl", path=str(pool), group_by="group")], preview_size=2)
    for grpo, what in [(False, "response token survives truncation"), (True, "room to generate")]:
        with pytest.raises(DataError, match=f"'long'.*all 3 examples are longer than the context.*{what}"):
            prepare(cfg, tok, 64, grpo=grpo)
    for policy in ("skip", "keep"):  # a flat pool's unusable cluster is skipped, named, and the run goes on
        data = prepare(DataConfig(target=cfg.target, candidates=cfg.candidates, preview_size=2,
                                  small_groups=policy), tok, 64)
        assert data.names() == ["ok"]
        assert any("'long'" in w and "skipped" in w for w in data.warnings)
    without_long = [SourceConfig(kind="jsonl", path=str(pool), group_by="group", exclude=["long"])]
    data = prepare(DataConfig(target=cfg.target, candidates=without_long, preview_size=2), tok, 64, grpo=True)
    assert all(isinstance(e, PromptExample) for it in data.items for e in it.examples)
    assert data.items[0].examples[0].reference in {r["response"] for r in ok_rows}


# --- full-parameter gradients -------------------------------------------------------------------------------


def test_full_parameter_gradient_is_the_mean_gradient_of_every_weight(tiny_model_dir):
    from convalue.engine.features.replica import build_featurizer

    tok = load_tokenizer(tiny_model_dir)
    exs = tuple(tokenize_examples(tok, [Example((("user", r["prompt"]), ("assistant", r["response"])))
                                        for r in chatterbot_pairs("german", 5)], 64))
    f = build_featurizer(spec_for(tiny_model_dir, parameters="full"))
    model = load_model(tiny_model_dir)
    n_weights = sum(p.numel() for p in model.parameters())
    assert f.dim == n_weights and f.token_budget is None
    vec = f.featurize([WorkItem("g", exs)])[0]
    ids, mask, labels = pad_batch(list(exs), tok.pad_token_id)
    per_example_loss(model, ids, mask, labels).mean().backward()
    expected = torch.cat([p.grad.reshape(-1) for _, p in model.named_parameters()]).numpy()
    np.testing.assert_allclose(vec, expected, rtol=1e-4, atol=1e-6)
    with pytest.raises(ConfigError, match="projection.kind.*compressing projection"):
        config_from_dict({"data": {"target": {"kind": "chatterbot", "include": ["marathi"]},
                                   "candidates": [{"kind": "chatterbot"}]},
                          "features": {"parameters": "full"}, "projection": {"kind": "identity"}})


# --- diagonal empirical Fisher ------------------------------------------------------------------------------


def test_diag_fisher_gram_is_the_transformed_euclidean_gram():
    rng = np.random.default_rng(0)
    G = rng.normal(size=(6, 9)) * rng.uniform(0.1, 3, size=9)
    G[:, 4] = 0.0  # a coordinate no candidate moves: outside M's support
    g_tar = rng.normal(size=9)
    Gv, gv, M = diag_fisher_vectors(G, g_tar)
    K, beta = Gv @ Gv.T, Gv @ gv
    F = np.mean(G**2, axis=0)
    M_ref = F / F.mean()
    np.testing.assert_allclose(M, M_ref)
    Gt = G * np.sqrt(M_ref)                                  # g~_i = M^(1/2) g_i
    gt = np.where(M_ref > 0, g_tar / np.sqrt(np.where(M_ref > 0, M_ref, 1)), 0)  # M^(+/2) g_tar
    np.testing.assert_allclose(K, Gt @ Gt.T, rtol=1e-12)
    np.testing.assert_allclose(beta, Gt @ gt, rtol=1e-12)
    assert np.all(np.linalg.eigvalsh(K) > -1e-10)
    iso = np.sign(rng.normal(size=(4, 5)))  # all |g_id| equal: M = I, the Euclidean Gram
    iso_v, _, _ = diag_fisher_vectors(iso, np.ones(5))
    K_iso = iso_v @ iso_v.T
    np.testing.assert_allclose(K_iso, iso @ iso.T)
    with pytest.raises(ValueError, match="every candidate vector is zero"):
        diag_fisher_vectors(np.zeros((2, 3)), np.ones(3))


# --- the mathematics source ---------------------------------------------------------------------------------


def test_mathematics_source_is_seeded_and_validated():
    src = SourceConfig(kind="mathematics", include=["arithmetic__add_or_sub", "numbers__gcd"], examples_per_group=5)
    groups = load_source(src)
    assert sorted(groups) == ["arithmetic__add_or_sub", "numbers__gcd"]
    assert all(len(g.examples) == 5 for g in groups.values())
    assert all(numeric_exact_match(e.messages[1][1], e.messages[1][1]) == 1.0 for g in groups.values()
               for e in g.examples)
    assert load_source(src)["numbers__gcd"].examples == groups["numbers__gcd"].examples
    other = load_source(SourceConfig(kind="mathematics", include=["numbers__gcd"], examples_per_group=5, seed=1))
    assert other["numbers__gcd"].examples != groups["numbers__gcd"].examples
    with pytest.raises(DataError, match="unknown module"):
        load_source(SourceConfig(kind="mathematics", include=["arithmetic__nope"]))
    with pytest.raises(ConfigError, match="not used by the mathematics source"):
        SourceConfig(kind="mathematics", path="x").validate()


def test_mathematics_round_number_runs_as_on_python_312():
    # Python 3.12 refuses the integral floats numbers__round_number passes to random.randint (3.11 only warns),
    # so warnings-as-errors stand in for 3.12; the generator's shim must give the draws 3.11 gives.
    request = json.dumps({"include": ["numbers__round_number"], "n": 4, "seed": 0})
    proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-m", "convalue.engine.data.mathgen", request],
                          capture_output=True, text=True, env=os.environ | {"PYTHONHASHSEED": "0"}, check=True,
                          cwd=Path(__file__).resolve().parents[1])
    pairs = json.loads(proc.stdout.splitlines()[-1])["groups"]["numbers__round_number"]
    group = load_source(SourceConfig(kind="mathematics", include=["numbers__round_number"], examples_per_group=4))
    assert [list(map(str, (e.messages[0][1], e.messages[1][1]))) for e in group["numbers__round_number"].examples] == pairs


def test_mathematics_every_module_runs_under_numpy_2_and_is_reproducible():
    """numpy 2 removed ndarray.itemset, which the polynomial and calculus modules call; the shim puts it back.
    Every module gives the same data in every process."""
    import sympy

    from convalue.engine.data.mathgen import _ItemsetArray, itemset_works

    a = np.zeros((2, 3), dtype=np.int64).view(_ItemsetArray)
    a.itemset(4, 7)  # one int: a flat index, as numpy 1 read it
    a.itemset((0, 2), 5)
    assert a.tolist() == [[0, 0, 5], [0, 7, 0]]
    b = np.empty((2,), dtype=object).view(_ItemsetArray)
    b.itemset((np.int64(1),), [3, 4])  # an object array keeps a list whole
    assert b[1] == [3, 4]

    class RemovedItemset(np.ndarray):  # numpy 2.0-2.3: the attribute is there, a call raises
        def itemset(self, *args):
            raise AttributeError("`itemset` was removed from the ndarray class in NumPy 2.0.")

    assert not itemset_works(np.zeros(1).view(RemovedItemset)) and itemset_works(a)
    assert itemset_works(np.zeros(1)) == (int(np.__version__.split(".")[0]) < 2)

    def generate(include: list[str] | None) -> dict:
        request = json.dumps({"include": include, "n": 3, "seed": 0})
        proc = subprocess.run([sys.executable, "-m", "convalue.engine.data.mathgen", request], capture_output=True, text=True,
                              env=os.environ | {"PYTHONHASHSEED": "0"}, check=True,
                              cwd=Path(__file__).resolve().parents[1])
        return json.loads(proc.stdout.splitlines()[-1])

    reply = generate(None)
    assert reply["broken"] == [] and len(reply["groups"]) == 56
    for question, answer in reply["groups"]["polynomials__collect"]:  # sampled and expanded through itemset
        expr = question.removeprefix("Collect the terms in ").removesuffix(".")
        assert sympy.simplify(sympy.sympify(expr) - sympy.sympify(answer)) == 0
    # the same data in another process (sympy's own generator is seeded; composed questions no longer follow
    # object addresses), and a module's data does not depend on which others were generated
    assert generate(None)["groups"] == reply["groups"]
    few = ["numbers__is_prime", "comparison__pair_composed", "polynomials__add"]
    assert generate(few)["groups"] == {name: reply["groups"][name] for name in few}


def test_split_cost_tokens_defaults_per_device_and_is_validated(tiny_model_dir):
    from convalue.engine.config import ModelConfig
    from convalue.engine.features.replica import CPU_SPLIT_COST_TOKENS, build_featurizer

    assert build_featurizer(spec_for(tiny_model_dir)).split_cost_tokens == CPU_SPLIT_COST_TOKENS  # null, CPU
    assert build_featurizer(spec_for(tiny_model_dir, split_cost_tokens=7)).split_cost_tokens == 7
    with pytest.raises(ConfigError, match="split_cost_tokens"):
        ModelConfig(split_cost_tokens=-1).validate()
