"""No leakage: every candidate example whose text equals an example the run trains the target on or evaluates on
(after casefolding, Unicode NFKC and collapsing whitespace, prompt and response together) is dropped before any
scoring, and the run records what was dropped."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from convalue.engine.data.examples import Example, Group

#: an example's normalised text: its (role, text) messages
Key = tuple[tuple[str, str], ...]


def normalise_text(text: str) -> str:
    """Text as the leakage check compares it: Unicode NFKC, casefolded, whitespace runs collapsed to one space."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return " ".join(folded.split())


def example_key(example: Example) -> Key:
    """An example's normalised messages (prompt and response together, each turn with its role)."""
    return tuple((role, normalise_text(content)) for role, content in example.messages)


@dataclass(frozen=True)
class ProtectedSet:
    """Examples no candidate may share: the target's training or validation split, or an evaluation (`name`)."""

    name: str
    examples: Sequence[Example]


@dataclass(frozen=True)
class GroupLeak:
    """One candidate group's examples equal to protected ones: how many it had, how many were dropped and which
    protected set each matched first; `removed` when nothing was left."""

    group: str
    origin: str
    examples: int
    dropped: int
    matched: dict[str, int] = field(default_factory=dict)

    @property
    def removed(self) -> bool:
        """Whether the group lost every example (and so left the pool)."""
        return self.dropped == self.examples

    def warning(self) -> str:
        """The one warning of this group."""
        where = ", ".join(f"{n} {_AS.get(s, f'of evaluation {s!r}')}" for s, n in self.matched.items())
        if self.removed:
            return (f"candidate group {self.group!r} ({self.origin}): every one of its {self.examples} example(s) "
                    f"equals a target or evaluation example ({where}): the group is dropped")
        return (f"candidate group {self.group!r} ({self.origin}): {self.dropped} of its {self.examples} example(s) "
                f"equal target or evaluation examples ({where}): dropped before valuation")

    def to_dict(self) -> dict:
        """As summary.json's data.leakage lists it."""
        return {"group": self.group, "examples": self.examples, "dropped": self.dropped,
                "matched": dict(self.matched), "removed": self.removed}


_AS = {"target_train": "of the target's training split", "target_val": "of the target's validation split"}


@dataclass(frozen=True)
class LeakageReport:
    """What the leakage check compared and dropped: the protected sets, the candidate examples checked, and every
    group that lost examples."""

    against: tuple[str, ...]
    checked: int
    groups: tuple[GroupLeak, ...] = ()

    @property
    def dropped(self) -> int:
        """Candidate examples dropped in all."""
        return sum(g.dropped for g in self.groups)

    @property
    def removed(self) -> list[str]:
        """The candidate groups dropped whole."""
        return [g.group for g in self.groups if g.removed]

    def line(self) -> str:
        """One sentence on the check and its outcome."""
        against = ", ".join(self.against)
        if not self.groups:
            return (f"Leakage check: none of the {self.checked} candidate examples equals an example of {against} "
                    "(compared casefolded, NFKC, whitespace collapsed).")
        removed = f"; {len(self.removed)} group(s) dropped whole ({', '.join(self.removed)})" if self.removed else ""
        return (f"Leakage check: {self.dropped} of the {self.checked} candidate examples equal an example of "
                f"{against} and were dropped before valuation, from {len(self.groups)} group(s){removed}.")

    def to_dict(self) -> dict:
        """summary.json's data.leakage."""
        return {"against": list(self.against), "checked": self.checked, "dropped": self.dropped,
                "removed": self.removed, "groups": [g.to_dict() for g in self.groups]}


def protected_index(sets: Iterable[ProtectedSet]) -> dict[Key, str]:
    """Each protected example's normalised text -> the first protected set holding it."""
    index: dict[Key, str] = {}
    for s in sets:
        for ex in s.examples:
            index.setdefault(example_key(ex), s.name)
    return index


def drop_leaks(candidates: list[Group], protected: Sequence[ProtectedSet]) -> tuple[list[Group], LeakageReport]:
    """The candidates without any example equal to a protected one (a group left with nothing is dropped), and the
    report of what went; a group that loses nothing is returned as it is."""
    index = protected_index(protected)
    kept: list[Group] = []
    leaks: list[GroupLeak] = []
    for g in candidates:
        hits = [index.get(example_key(ex)) for ex in g.examples]
        if not any(h is not None for h in hits):
            kept.append(g)
            continue
        matched: dict[str, int] = {}
        for h in hits:
            if h is not None:
                matched[h] = matched.get(h, 0) + 1
        leak = GroupLeak(g.name, g.origin, len(g.examples), sum(matched.values()),
                         {s.name: matched[s.name] for s in protected if s.name in matched})
        leaks.append(leak)
        if leak.removed:
            continue
        keep = [i for i, h in enumerate(hits) if h is None]
        members = None if g.members is None else [g.members[i] for i in keep]
        kept.append(Group(g.name, [g.examples[i] for i in keep], g.origin, members))
    report = LeakageReport(tuple(s.name for s in protected), sum(len(g.examples) for g in candidates), tuple(leaks))
    return kept, report
