"""Exact-match accuracy by greedy generation: the match functions on fixed strings, the TRL adapter, and greedy
generation with the tiny random Llama (runs, deterministic, scores in [0, 1])."""

from __future__ import annotations

import pytest

from convalue.engine.data.examples import Example
from convalue.engine.features.rewards import RewardError
from convalue.engine.protocol.accuracy import (
    AccuracyResult,
    exact_match_accuracy,
    greedy_completions,
    pointwise,
    trl_reward,
)

PAIRS = [("What is 5 + 7?", "5 + 7 = 12\n#### 12"), ("What is 2 * 3?", "6"), ("Say hello.", "#### 1"),
         ("Count to three.", "3")]


def test_numeric_exact_match_on_fixed_strings():
    score = pointwise()  # the built-in numeric exact match
    completions = ["so the answer is 12", "13", "no number here", "1, 2, 3"]
    assert score([p for p, _ in PAIRS], completions, [r for _, r in PAIRS]) == [1.0, 0.0, 0.0, 1.0]
    assert pointwise(lambda c, r: 0.5)(["p"], ["c"], ["r"]) == [0.5]
    with pytest.raises(RewardError, match="example 0"):
        pointwise(lambda c, r: float("nan"))(["p"], ["c"], ["r"])


def trl_exact(prompts, completions, answer, **kwargs):
    """A TRL-style reward function: exact string match against the `answer` column."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(t.strip() == a) for t, a in zip(texts, answer)]


def test_trl_reward_adapter_passes_references_as_a_column():
    assert trl_reward(trl_exact)(["p", "q"], [" 12 ", "7"], ["12", "8"]) == [1.0, 0.0]
    seen = {}

    def spy(prompts, completions, solution, **kwargs):
        seen.update(prompts=prompts, completions=completions, solution=solution)
        return [1.0] * len(completions)

    assert trl_reward(spy, reference_key="solution", conversational=True)(["p"], ["c"], ["r"]) == [1.0]
    assert seen == {"prompts": [[{"role": "user", "content": "p"}]],
                    "completions": [[{"role": "assistant", "content": "c"}]], "solution": ["r"]}
    with pytest.raises(RewardError, match="not a finite number"):
        trl_reward(lambda prompts, completions, **kw: [None])(["p"], ["c"], ["r"])
    with pytest.raises(RewardError, match="2 values for 1"):
        trl_reward(lambda prompts, completions, **kw: [1.0, 1.0])(["p"], ["c"], ["r"])


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from convalue.engine.model.loading import load_model, load_tokenizer

    return load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)


def test_greedy_accuracy_runs_and_is_deterministic(tiny):
    model, tok = tiny
    first = exact_match_accuracy(model, tok, PAIRS, max_new_tokens=6, batch_size=3)
    again = exact_match_accuracy(model, tok, PAIRS, max_new_tokens=6, batch_size=3)
    assert isinstance(first, AccuracyResult) and first == again and first.completions == again.completions
    assert len(first.scores) == 4 and 0.0 <= first.mean <= 1.0 and all(s in (0.0, 1.0) for s in first.scores)
    assert first.to_dict()["n"] == 4
    assert not model.training  # left as it was


def test_the_scorer_sees_each_prompt_its_greedy_completion_and_reference(tiny):
    model, tok = tiny
    calls = []

    def scorer(prompts, completions, references):
        calls.append((prompts, completions, references))
        return [1.0 if c == completions[0] else 0.0 for c in completions]

    items = [*PAIRS[:2], Example((("system", "Be brief."), ("user", "Name a colour."), ("assistant", "red")))]
    result = exact_match_accuracy(model, tok, items, scorer=scorer, max_new_tokens=5, batch_size=2)
    prompts, completions, references = calls[0]
    assert prompts == ["What is 5 + 7?", "What is 2 * 3?", "Name a colour."]
    assert references == [PAIRS[0][1], "6", "red"] and completions == list(result.completions)
    assert result.scores[0] == 1.0 and result.mean == pytest.approx(sum(result.scores) / 3)
    # left padding: a prompt's greedy completion does not depend on the batch it shares
    from convalue.engine.data.tokenize import tokenize_prompt

    ids = [tokenize_prompt(tok, Example((("user", p), ("assistant", r)))).input_ids for p, r in PAIRS]
    batched = greedy_completions(model, tok, ids, max_new_tokens=5, batch_size=4)
    alone = [greedy_completions(model, tok, [i], max_new_tokens=5)[0] for i in ids]
    assert batched == alone


def test_accuracy_needs_items(tiny):
    with pytest.raises(ValueError, match="at least one"):
        exact_match_accuracy(*tiny, [])
