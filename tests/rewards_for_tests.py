"""Reward functions the GRPO tests name by file path (as a user's config would)."""


def length(completion: str, reference: str) -> float:
    """Longer completions score higher: varies across samples of a random model."""
    return float(len(completion))


def constant(completion: str, reference: str) -> float:
    """The same reward for everything: every advantage is zero."""
    return 1.0


def broken(completion: str, reference: str) -> float:
    """A reward function with a bug."""
    raise ValueError("boom")
