"""Chat-template formatting and tokenisation with labels on response (assistant) tokens only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from convalue.engine.data.examples import Example
from convalue.engine.model.loading import ModelError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

IGNORE = -100


@dataclass(frozen=True)
class TokenizedExample:
    """Token ids and labels (IGNORE outside assistant turns)."""

    input_ids: tuple[int, ...]
    labels: tuple[int, ...]

    @property
    def n_response(self) -> int:
        """Number of labelled (response) tokens."""
        return sum(1 for x in self.labels if x != IGNORE)

    def __len__(self) -> int:
        return len(self.input_ids)


def _render(tokenizer: PreTrainedTokenizerBase, chat: list[dict], *, generation_prompt: bool) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation_prompt)
    # plain fallback for tokenizers without a chat template
    text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in chat)
    return text + ("Assistant: " if generation_prompt else "")


def response_spans(tokenizer: PreTrainedTokenizerBase, example: Example) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its assistant turns (through end-of-turn)."""
    chat = example.as_chat()
    full = _render(tokenizer, chat, generation_prompt=False)
    spans = []
    for i, m in enumerate(chat):
        if m["role"] != "assistant":
            continue
        before = _render(tokenizer, chat[:i], generation_prompt=True)
        upto = _render(tokenizer, chat[: i + 1], generation_prompt=False)
        if not full.startswith(upto) or not upto.startswith(before):
            raise ModelError(f"{tokenizer.name_or_path}: the chat template is not prefix-stable (the conversation "
                             "up to a reply renders differently inside the whole one), so the response tokens cannot "
                             "be located; use a model whose template is, or save the tokenizer with a plainer one")
        end = len(upto.rstrip())
        spans.append((len(before), end))
    return full, spans


def tokenize_example(tokenizer: PreTrainedTokenizerBase, example: Example, max_length: int) -> TokenizedExample:
    """Tokenise one example; labels cover assistant tokens only; cut on the right at max_length."""
    text, spans = response_spans(tokenizer, example)
    if all(not c.strip() for r, c in example.messages if r == "assistant"):
        spans = []  # an empty response teaches only end-of-turn: treat it as no response at all
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = enc["input_ids"][:max_length]
    offsets = enc["offset_mapping"][:max_length]
    labels = []
    for tok, (start, end) in zip(ids, offsets):
        inside = any(s <= start < e and end > start for s, e in spans)
        labels.append(tok if inside else IGNORE)
    return TokenizedExample(tuple(ids), tuple(labels))


def tokenize_examples(tokenizer: PreTrainedTokenizerBase, examples: list[Example], max_length: int) -> list[TokenizedExample]:
    """Tokenise a list of examples (order kept)."""
    return [tokenize_example(tokenizer, ex, max_length) for ex in examples]


@dataclass(frozen=True)
class PromptExample:
    """A GRPO prompt: the chat up to its last assistant turn, rendered with the generation prompt, and the reference."""

    input_ids: tuple[int, ...]
    reference: str

    def __len__(self) -> int:
        return len(self.input_ids)


def tokenize_prompt(tokenizer: PreTrainedTokenizerBase, example: Example) -> PromptExample:
    """The prompt tokens of an example (its last assistant turn removed) and that turn's text as the reference."""
    chat = example.as_chat()
    last = max(i for i, m in enumerate(chat) if m["role"] == "assistant")
    text = _render(tokenizer, chat[:last], generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return PromptExample(tuple(ids), chat[last]["content"])


@dataclass(frozen=True)
class WorkItem:
    """One group's tokenised preview: the unit of work a gradient worker receives."""

    name: str
    examples: tuple[TokenizedExample, ...]
