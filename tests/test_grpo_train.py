"""GRPO fine-tunes (finetune.objective `grpo`) on the tiny real Llama: prompts and references, the update, refusals."""

from __future__ import annotations

import dataclasses

import pytest

from convalue.engine.config import ConfigError, FinetuneConfig, LoraConfig
from convalue.engine.data.examples import Example
from convalue.engine.protocol.accuracy import pointwise
from convalue.engine.protocol.finetune import evaluate_loss
from convalue.engine.protocol.grpo_train import GrpoTrainError, grpo_finetune, prompt_of

PAIRS = [("What is 5 + 7?", "12"), ("What is 2 * 3?", "6"), ("What is 9 - 4?", "5"), ("What is 8 / 2?", "4")]


def _example(prompt: str, response: str) -> Example:
    return Example((("user", prompt), ("assistant", response)))


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from convalue.engine.data.tokenize import tokenize_examples
    from convalue.engine.model.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    rows = tokenize_examples(tok, [_example(p, r) for p, r in PAIRS], 96)
    return tiny_model_dir, tok, rows


def _cfg(**over) -> FinetuneConfig:
    return dataclasses.replace(FinetuneConfig(), objective="grpo", steps=3, batch_size=2, rho=0.5, lr=5e-3,
                               grpo_generations=2, grpo_max_new_tokens=4, **over)


def _run(tiny, scorer, cfg: FinetuneConfig | None = None, steps: list | None = None):
    from convalue.engine.model.loading import load_model

    model_dir, tok, rows = tiny
    model = load_model(model_dir)
    base = evaluate_loss(model, rows[2:], 2, tok.pad_token_id, "cpu", None)
    result = grpo_finetune(model, tok, tok.pad_token_id, cfg or _cfg(), LoraConfig(r=4, alpha=8), label="t",
                           target=rows[:2], aux={"extra": rows[2:]}, val=rows[2:], max_length=96, scorer=scorer,
                           base_val_loss=base, on_step=None if steps is None else steps.append)
    return base, result


def test_a_prompt_is_the_chat_before_its_answer_and_the_reference_is_the_answer(tiny):
    from convalue.engine.data.tokenize import tokenize_prompt

    _, tok, rows = tiny
    for (p, r), row in zip(PAIRS, rows):
        prompt = prompt_of(row, tok)
        assert prompt.reference.strip() == r
        assert prompt.input_ids == tokenize_prompt(tok, _example(p, r)).input_ids  # what generation is asked


def test_equal_rewards_leave_theta_0_as_it_was(tiny):
    """Every advantage is zero and the adapter starts at theta_0 (B = 0): no gradient, so the validation loss is
    theta_0's exactly, the KL to theta_0 stays 0 and every prompt is counted as zero-advantage."""
    steps = []
    base, result = _run(tiny, pointwise(lambda completion, reference: 1.0), steps=steps)
    assert result.objective == "grpo" and result.val_loss == base
    assert result.train_rewards == [1.0, 1.0, 1.0] and result.train_reward_first == result.train_reward_last == 1.0
    assert [s.kl for s in steps] == [0.0, 0.0, 0.0] and all(s.zero_advantage_prompts == 2 for s in steps)
    assert result.target_steps + result.aux_steps == 3 and {s.source for s in steps} <= {"target", "group 'extra'"}


def test_a_reward_that_varies_moves_the_policy_and_is_seeded(tiny):
    def longer(completion: str, reference: str) -> float:
        return float(len(completion))

    steps: list = []
    base, result = _run(tiny, pointwise(longer), steps=steps)
    assert result.val_loss != base  # the adapter moved off theta_0
    assert steps[0].kl == 0.0 and steps[-1].kl > 0.0  # the KL to theta_0 opens once the policy has moved
    assert len(result.train_rewards) == 3 and result.first_train_loss == steps[0].loss
    again: list = []
    _, repeat = _run(tiny, pointwise(longer), steps=again)
    assert repeat.train_rewards == result.train_rewards and repeat.val_loss == result.val_loss


def test_references_the_reward_cannot_score_are_refused_before_training(tiny):
    _, tok, rows = tiny
    from convalue.engine.data.tokenize import tokenize_examples

    words = tokenize_examples(tok, [_example("Name a colour.", "red")], 96)
    from convalue.engine.model.loading import load_model

    with pytest.raises(GrpoTrainError, match="group 'words'.*references the reward can check"):
        grpo_finetune(load_model(tiny[0]), tok, tok.pad_token_id, _cfg(), LoraConfig(r=4, alpha=8), label="t",
                      target=rows[:2], aux={"words": words}, val=rows[2:], max_length=96)


def test_a_reward_that_raises_names_the_step(tiny):
    def broken(completion: str, reference: str) -> float:
        if completion != reference:  # the references pass the check before training; a sampled completion does not
            raise ValueError("boom")
        return 1.0

    with pytest.raises(GrpoTrainError, match=r"t: (target|group 'extra'), step 0: .*raised ValueError: boom"):
        _run(tiny, pointwise(broken))


@pytest.mark.parametrize("over, field", [({"strategy": "deepspeed"}, "objective"),
                                         ({"grpo_generations": 1}, "grpo_generations"),
                                         ({"grpo_top_p": 0.0}, "grpo_top_p"),
                                         ({"grpo_reward": "no_such_reward"}, "grpo_reward")])
def test_grpo_settings_are_checked_at_config_time(over, field):
    with pytest.raises(ConfigError) as err:
        dataclasses.replace(FinetuneConfig(), objective="grpo", **over).validate()
    assert err.value.field.endswith(field)
