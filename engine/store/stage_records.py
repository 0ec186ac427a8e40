"""What each stage of a command produced, as typed frozen records; `assemble` builds summary.json's RunSummary from
them in one place (each summary field has one stage that sets it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from convalue.engine.store.summary import RunSummary, SolverRecord


@dataclass(frozen=True)
class StartRecord:
    """The command's inputs: its config echo, package versions, model and data."""

    config: dict
    packages: dict
    model: dict | None = None
    data: dict | None = None


@dataclass(frozen=True)
class ImportRecord:
    """What `convalue score` imported: the target, the number of candidates and their dimension."""

    data: dict


@dataclass(frozen=True)
class AttemptRecord:
    """This start's id (the `attempt` tag of the run's Ray metrics)."""

    attempt: str | None


@dataclass(frozen=True)
class ValuationRecord:
    """The primary representation valued: featurisation, Gram, metric, row order, space and certificate; the run's
    other representations beside it."""

    featurize: dict | None
    gram: dict | None
    order: list[str]
    space: str
    solver: SolverRecord
    metric: dict | None = None
    representations: dict | None = None


@dataclass(frozen=True)
class SelectionRecord:
    """The top-k selection and the printed ranking."""

    selected: list[str]
    ranking: list[str]


@dataclass(frozen=True)
class PathRecord:
    """The regularisation path: its grid and what it buys at each k."""

    path: dict


@dataclass(frozen=True)
class BootstrapRecord:
    """How stable the selection is under resampled previews."""

    bootstrap: dict


@dataclass(frozen=True)
class EvaluationRecord:
    """The fine-tunes and what the evaluation concluded (or an analysis's own record under its stage name)."""

    evaluation: dict | None
    finetune: list[dict] | None = None


@dataclass(frozen=True)
class ResolveRecord:
    """A re-solve of a finished run: its solution, selection and which fine-tunes it left stale."""

    solver: SolverRecord
    selected: list[str]
    ranking: list[str]
    resolved: bool = True
    bootstrap: dict | None = None
    finetune_stale: str | None = None


@dataclass(frozen=True)
class EndRecord:
    """How the command ended: its status, timings, how far each stage got, what it survived, and why it failed."""

    status: str
    timings_s: dict | None = None
    progress: dict | None = None
    recovered: dict | None = None
    failed_stage: str | None = None
    error: str | None = None
    signal: str | None = None
    finetune_finished: list[dict] | None = None
    finetune_tuning: dict | None = None  # rho_k chosen before a failure in the reported fine-tunes


def assemble(records: Sequence[object], base: RunSummary | None = None) -> RunSummary:
    """The summary of these records (over `base`, a finished run's summary a re-solve revises); a field two records
    both set is a ValueError (one stage owns each field)."""
    values: dict[str, object] = {}
    owner: dict[str, str] = {}
    for record in records:
        for f in dataclasses.fields(record):
            value = getattr(record, f.name)
            if value is None:
                continue
            if f.name in owner:
                raise ValueError(f"summary field {f.name!r} set by both {owner[f.name]} and "
                                 f"{type(record).__name__}")
            owner[f.name] = type(record).__name__
            values[f.name] = value
    if base is None:
        return RunSummary(**values)
    return dataclasses.replace(base, **values)
