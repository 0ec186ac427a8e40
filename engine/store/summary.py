"""summary.json's schema: RunSummary and its sections, read and written here and nowhere else."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convalue.engine.files.errors import StoreError
from convalue.engine.files.folder import RunFolder, as_folder
from convalue.engine.store.artifacts import write_json

STATUSES = ("running", "complete", "failed")
SPACES = ("gram", "gradients")
METRICS = ("euclidean", "diag_fisher")


@dataclass
class SolverRecord:
    """The solve's certificate as summary.json keeps it (KMMSolution.summary() plus the run's normalize and rank
    bound); solver-specific details (fallback, multiplier, tol, ...) stay in `info`, written flat."""

    form: str
    gamma: float | None
    budget: float | None
    method: str
    status: str
    objective: float
    kkt: float
    iterations: int | None = None
    time_s: float = 0.0
    nnz: int = 0
    l1: float = 0.0
    normalize: str = "none"
    rank_bound: int | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_solution(cls, sol: Any, normalize: str, rank_bound: int | None) -> SolverRecord:
        """The record of a KMMSolution."""
        return cls.from_dict(sol.summary() | {"normalize": normalize, "rank_bound": rank_bound})

    @classmethod
    def from_dict(cls, data: dict) -> SolverRecord:
        """The record of summary.json's `solver` object (unknown keys go to info)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"info"}
        return cls(**{k: v for k, v in data.items() if k in names},
                   info={k: v for k, v in data.items() if k not in names})

    def to_dict(self) -> dict:
        """As written to summary.json: flat, without a null rank bound."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "info"}
        if out["rank_bound"] is None:
            del out["rank_bound"]
        return out | self.info

    def describe(self) -> str:
        """One line: method, form, the multiplier or budget, normalisation, status and KKT violation."""
        what = f"gamma={self.gamma}" if self.gamma is not None else f"budget={self.budget}"
        return f"{self.method} {self.form} ({what}, normalize={self.normalize}) status={self.status} kkt={self.kkt:.2e}"



@dataclass
class RunSummary:
    """A run folder's summary.json: status, config echo, what each stage gave, timings; None fields are not written."""

    status: str
    config: dict = field(default_factory=dict)
    packages: dict[str, str | None] = field(default_factory=dict)
    attempt: str | None = None  # this start's id, the `attempt` tag of the run's Ray metrics
    model: dict | None = None
    data: dict | None = None
    featurize: dict | None = None
    metric: dict | None = None
    representations: dict | None = None  # the run's other representations: featurisation, Gram, certificate
    path: dict | None = None  # the regularisation path (solver.path): its grid and what it buys at each k
    gram: dict | None = None  # how the blocked Gram was built: panels, tiles per node, bytes read and moved
    order: list[str] | None = None
    space: str | None = None
    solver: SolverRecord | None = None
    bootstrap: dict | None = None
    selected: list[str] | None = None
    ranking: list[str] | None = None
    finetune: list[dict] | None = None
    evaluation: dict | None = None
    timings_s: dict[str, float] | None = None
    progress: dict | None = None
    failed_stage: str | None = None
    error: str | None = None
    signal: str | None = None  # SIGTERM or SIGINT where one stopped the run
    recovered: dict | None = None  # retries, worker restarts and damaged blocks the run survived
    finetune_finished: list[dict] | None = None
    finetune_tuning: dict | None = None  # a failed run's rho_k, where finetune.tune chose it before the failure
    resolved: bool | None = None
    finetune_stale: str | None = None
    artifacts: dict[str, dict] | None = None  # every file the run left: {name: {sha256, bytes}} (store.record)

    def to_dict(self) -> dict:
        """The JSON object summary.json holds."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value.to_dict() if hasattr(value, "to_dict") else value
        return out

    def write(self, run_dir: RunFolder | Path) -> None:
        """Write <run_dir>/summary.json atomically."""
        write_json(self.to_dict(), run_dir, "summary.json")

    @classmethod
    def read(cls, run_dir: RunFolder | Path, missing: str = "not a run folder (no summary.json)") -> RunSummary:
        """<run_dir>/summary.json: FileNotFoundError `<run_dir>: <missing>` without one, a StoreError naming the file
        and field where it is not a summary."""
        folder = as_folder(run_dir)
        path = folder / "summary.json"
        if not folder.is_file("summary.json"):
            raise FileNotFoundError(f"{run_dir}: {missing}")
        try:
            data = json.loads(folder.read_text("summary.json"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StoreError(f"{path}: not readable JSON ({exc})") from None
        except OSError as exc:
            raise StoreError(f"{path}: cannot be read ({exc.strerror or exc})") from None
        if not isinstance(data, dict):
            raise StoreError(f"{path}: expected a JSON object, got {type(data).__name__}")
        return cls.from_dict(data, path)

    @classmethod
    def from_dict(cls, data: dict, path: Path | str = "summary.json") -> RunSummary:
        """A summary from its JSON object; a field of the wrong shape is a StoreError naming it."""
        if not isinstance(data.get("status"), str):
            raise StoreError(f"{path}: field `status` is missing (not a convalue summary)")
        shapes = {"config": dict, "packages": dict, "attempt": str, "model": dict, "data": dict, "featurize": dict, "metric": dict, "gram": dict, "representations": dict, "path": dict, "order": list,
                  "space": str, "solver": dict, "bootstrap": dict, "selected": list, "ranking": list,
                  "finetune": list, "evaluation": dict, "timings_s": dict, "progress": dict, "failed_stage": str,
                  "error": str, "signal": str, "recovered": dict, "finetune_finished": list, "finetune_tuning": dict,
                  "resolved": bool,
                  "finetune_stale": str, "artifacts": dict}
        kwargs: dict[str, Any] = {"status": data["status"]}
        for name, shape in shapes.items():
            value = data.get(name)
            if value is None or name == "order":  # the order's shape is checked where it is needed
                kwargs[name] = value
            elif not isinstance(value, shape):
                raise StoreError(f"{path}: field `{name}` is malformed")
            else:
                kwargs[name] = value
        try:
            if kwargs["solver"] is not None:
                kwargs["solver"] = SolverRecord.from_dict(kwargs["solver"])
        except TypeError:
            raise StoreError(f"{path}: field `solver` is malformed") from None
        return cls(**kwargs)

    def config_section(self, name: str) -> dict:
        """The config echo's section `name` ({} where absent)."""
        section = self.config.get(name) if isinstance(self.config, dict) else None
        return section if isinstance(section, dict) else {}

    @property
    def metric_kind(self) -> object:
        """The run's features.metric (None where the echo lacks it)."""
        return self.config_section("features").get("metric")

    @property
    def select_k(self) -> object:
        """The run's select.k as recorded (unchecked)."""
        return self.config_section("select").get("k")
