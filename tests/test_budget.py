"""finetune.budget: `fixed` (auxiliary steps replace target steps, the paper's Alg. 1) and `additive` (the target's
steps kept, the auxiliary ones on top), from the schedule to a real fine-tune and the stored record's key."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import chatterbot_pairs
from test_finetune_store import AUX, SPEC, _store, _with

from convalue.engine.config import ConfigError, FinetuneConfig, LoraConfig
from convalue.engine.protocol.finetune import mixing_schedule


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_additive_keeps_every_target_step_and_extends_the_fixed_draws(seed):
    fixed = mixing_schedule(24, 0.5, 3, seed)
    additive = mixing_schedule(24, 0.5, 3, seed, additive=True)
    assert sum(s < 0 for s in additive) == 24 and len(additive) > 24  # at rho 0.5 some step is auxiliary
    assert additive[:24] == fixed  # the same Bernoulli draws, continued
    assert sum(s < 0 for s in fixed) < 24
    assert mixing_schedule(24, 0.5, 0, seed, additive=True) == [-1] * 24 == mixing_schedule(24, 0.5, 0, seed)


def test_additive_needs_a_target_step_to_draw():
    with pytest.raises(ValueError, match="rho > 0"):
        mixing_schedule(4, 0.0, 2, 0, additive=True)
    with pytest.raises(ConfigError, match="rho"):
        FinetuneConfig(budget="additive", rho=0.0).validate()
    with pytest.raises(ConfigError, match="rho_by_k.3"):
        FinetuneConfig(budget="additive", ks=[3], rho_by_k={3: 0.0}).validate()
    FinetuneConfig(budget="additive", rho=0.2).validate()


def test_additive_is_refused_under_deepspeed():
    with pytest.raises(ConfigError, match="budget"):
        FinetuneConfig(budget="additive", strategy="deepspeed").validate()


def test_the_budget_keys_a_fine_tune_that_buys_groups_and_not_the_target_alone(tmp_path):
    fixed, additive = _store(tmp_path), _store(tmp_path, _with(SPEC, budget="additive"))
    assert "budget" not in fixed._base["settings"]["finetune"]  # keys of before `budget` existed stand
    assert additive.job_key(AUX) != fixed.job_key(AUX)
    assert additive.job_key({}) == fixed.job_key({})  # the target-only run: one fine-tune under both
    assert additive.job_key({}, seed=1, rho=1.0) == fixed.job_key({}, seed=1, rho=1.0)
    assert additive.job_key(AUX, seed=1) != fixed.job_key(AUX, seed=1)


def test_an_additive_fine_tune_trains_the_target_alone_s_steps_and_more(tiny_model_dir):
    """A real fine-tune: the additive run's target steps are the target-only run's, its total steps more; the
    target-only run is the same fine-tune under either budget."""
    from convalue.engine.data.examples import Example
    from convalue.engine.data.tokenize import tokenize_examples
    from convalue.engine.model.loading import load_model, load_tokenizer
    from convalue.engine.protocol.finetune import finetune

    tok = load_tokenizer(tiny_model_dir)
    rows = tokenize_examples(tok, [Example((("user", r["prompt"]), ("assistant", r["response"])))
                                   for r in chatterbot_pairs("english", 10)], 64)
    target, aux, val = rows[:4], {"g": rows[4:8]}, rows[8:]
    fixed = FinetuneConfig(steps=6, batch_size=2, rho=0.5, lr=1e-3, seed=3)
    additive = replace(fixed, budget="additive")
    lora = LoraConfig(r=4, alpha=8)

    def run(cfg, aux_groups):
        return finetune(load_model(tiny_model_dir), tok.pad_token_id, cfg, lora, label="t", target=target,
                        aux=aux_groups, val=val)

    alone_fixed, alone_additive = run(fixed, {}), run(additive, {})
    assert alone_fixed.target_steps == alone_additive.target_steps == alone_fixed.steps == 6
    assert alone_additive.val_loss == alone_fixed.val_loss
    bought_fixed, bought_additive = run(fixed, aux), run(additive, aux)
    assert bought_fixed.steps == 6 and bought_fixed.target_steps < 6
    assert bought_additive.target_steps == alone_fixed.target_steps == 6
    assert bought_additive.steps == 6 + bought_additive.aux_steps > 6
    assert bought_additive.aux_steps == len(mixing_schedule(6, 0.5, 1, 3, additive=True)) - 6
