"""Chat-template formatting and tokenisation with labels on response (assistant) tokens only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from convalue.engine.data.examples import Example
from convalue.engine.model.loading import ModelError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

IGNORE = -100
#: characters of each message kept before tokenising, per token of max_length (a token spans a few characters; a
#: message of longer tokens is cut again, wider), and the tokens kept clear of the cut
CHARS_PER_TOKEN = 32
MARGIN_TOKENS = 8


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


def _cut(example: Example, chars: int) -> tuple[Example, str | None]:
    """The example with each message cut to its first `chars` characters, and the first cut message's kept text
    (None when none was longer)."""
    kept, first = [], None
    for role, content in example.messages:
        if len(content) > chars:
            content = content[:chars]
            first = content if first is None else first
        kept.append((role, content))
    return Example(tuple(kept)), first


def _prefix_is_exact(text: str, offsets: list[tuple[int, int]], kept: str, n: int) -> bool:
    """Whether the first n tokens of `text` (their offsets) end MARGIN_TOKENS tokens before the end of `kept`, the
    first message that was cut: then they are the first n tokens of the uncut text too."""
    core = kept.strip()  # a template may trim a message's white space
    at = text.find(core)
    last = n + MARGIN_TOKENS - 1
    return at >= 0 and len(offsets) > last and offsets[last][1] <= at + len(core)


def _encode_bounded(tokenizer: PreTrainedTokenizerBase, example: Example, max_length: int,
                    render: Callable[[Example], tuple[str, Any]]) -> tuple[str, Any, dict]:
    """(text, what render returned besides it, the encoding with offsets) of the example with each message cut to
    max_length * CHARS_PER_TOKEN characters, so a long example costs memory for its first tokens only, not its
    whole text; the cut is doubled until it leaves the first max_length tokens as the uncut text's (a message of
    few, long tokens), so the result never depends on it."""
    chars = max_length * CHARS_PER_TOKEN
    while True:
        cut, kept = _cut(example, chars)
        text, extra = render(cut)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if kept is None or _prefix_is_exact(text, enc["offset_mapping"], kept, max_length):
            return text, extra, enc
        chars *= 2


def tokenize_example(tokenizer: PreTrainedTokenizerBase, example: Example, max_length: int) -> TokenizedExample:
    """Tokenise one example; labels cover assistant tokens only; cut on the right at max_length (its text cut
    before tokenising, so a long example takes no more memory than its first max_length tokens need)."""
    text, spans, enc = _encode_bounded(tokenizer, example, max_length, lambda ex: response_spans(tokenizer, ex))
    if all(not c or c.isspace() for r, c in example.messages if r == "assistant"):
        spans = []  # an empty response teaches only end-of-turn: treat it as no response at all
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


def tokenize_prompt(tokenizer: PreTrainedTokenizerBase, example: Example,
                    max_length: int | None = None) -> PromptExample:
    """The prompt tokens of an example (its last assistant turn removed) and that turn's text as the reference;
    with max_length, a longer prompt comes back cut to its first max_length tokens (enough to tell that it does not
    fit), its text cut before tokenising as tokenize_example's is."""
    chat = example.as_chat()
    last = max(i for i, m in enumerate(chat) if m["role"] == "assistant")
    prompt = Example(example.messages[:last])
    if max_length is None:
        ids = tokenizer(_render(tokenizer, prompt.as_chat(), generation_prompt=True),
                        add_special_tokens=False)["input_ids"]
    else:
        _, _, enc = _encode_bounded(tokenizer, prompt, max_length,
                                    lambda ex: (_render(tokenizer, ex.as_chat(), generation_prompt=True), None))
        ids = enc["input_ids"][:max_length]
    return PromptExample(tuple(ids), chat[last]["content"])


@dataclass(frozen=True)
class WorkItem:
    """One group's tokenised preview: the unit of work a gradient worker receives."""

    name: str
    examples: tuple[TokenizedExample, ...]
