"""The valuation stages of one representation — featurise, Gram, solve — as one function with a typed result, and
the checks they share; the driver runs it once per representation of the run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from convalue.engine.config import ConfigError, RunConfig
from convalue.engine.data.prepare import PreparedData, full_items
from convalue.engine.driver.featurize import FeaturizeResult, featurize
from convalue.engine.driver.incremental import value_rows
from convalue.engine.driver.prior import PriorRun
from convalue.engine.files.folder import RunFolder
from convalue.engine.model.spec import ReplicaSpec
from convalue.engine.selection.blocked import GramResult
from convalue.engine.selection.incremental import ValuationState
from convalue.engine.selection.solve import SolveSpec
from convalue.engine.store.summary import SolverRecord
from convalue.engine.store.vectors import VectorStore
from convalue.solvers import KMMSolution

#: solver.space `auto` solves in gradient space above this many candidates (K would not fit in memory)
GRADIENT_SPACE_MIN_N = 20_000
#: how a representation names its methods in the evaluation (`tv`, `tv+kmm`, ...)
TAGS = {"one_step": "one_step", "task_vector": "tv", "grpo": "grpo"}


def solver_space(cfg: RunConfig, n: int) -> str:
    """`gram` or `gradients` for a run of n candidates (solver.space, `auto` resolved by `choose_space`)."""
    return choose_space(cfg.solver.space, n)


def choose_space(space: str, n: int) -> str:
    """`gram` or `gradients`: `auto` chooses gradients above GRADIENT_SPACE_MIN_N candidates."""
    if space != "auto":
        return space
    return "gradients" if n > GRADIENT_SPACE_MIN_N else "gram"


def check_nonzero(cfg: RunConfig | None, names: list[str], row_norm2: np.ndarray, g_tar: np.ndarray) -> None:
    """Refuse all-zero group vectors (a zero vector has no direction to value), saying why they arise."""
    zero = (["the target"] if not np.any(g_tar) else []) + [n for n, r in zip(names, row_norm2) if r == 0]
    if not zero:
        return
    why = ("every prompt's completions got the same reward, so every advantage is 0: raise "
           "features.grpo_generations or grpo_temperature, or use a reward that separates completions"
           if cfg is not None and cfg.features.representation == "grpo" else
           "the loss does not depend on the featurised parameters" if cfg is not None else "an all-zero vector")
    raise ValueError(f"group vector is exactly zero for {zero[:10]} ({len(zero)} in all): {why}")


def check_k_fits(k: int, n: int, field: str) -> None:
    """Refuse a budget k larger than the pool of n groups (it would buy fewer groups than it says)."""
    if k > n:
        raise ConfigError(f"is larger than the pool's {n} candidate group(s)", field=field, value=k)


def make_run_folder(run_dir: RunFolder, field: str, value: object) -> None:
    """Create the run folder, or a ConfigError on the setting (`field`) that named a place it cannot be made."""
    try:
        run_dir.makedirs()
    except OSError as exc:
        raise ConfigError(f"the run folder {run_dir} cannot be created: {exc}", field=field, value=value) from None


def check_budgets(cfg: RunConfig, n: int) -> None:
    """Refuse a selection or an evaluated budget k larger than the pool (it would buy fewer groups than it says)."""
    check_k_fits(cfg.select.k, n, "select.k")
    if cfg.finetune.enabled and (too_big := [k for k in cfg.finetune.ks or [] if k > n]):
        raise ConfigError(f"lists budgets larger than the pool's {n} candidate group(s): {too_big}",
                          field="finetune.ks", value=cfg.finetune.ks)


@dataclass(eq=False)
class Valuation:
    """One representation valued: its vectors (where they live), Gram, solve spec and solution."""

    representation: str
    cfg: RunConfig  # the run's config with this representation
    store: VectorStore
    features: FeaturizeResult
    gram: GramResult
    spec: SolveSpec
    sol: KMMSolution
    state: ValuationState | None = None  # what the next valuation of a grown pool starts from

    @property
    def tag(self) -> str:
        """The representation's short name in method names (`one_step`, `tv`, `grpo`)."""
        return TAGS[self.representation]

    def record(self) -> dict:
        """What summary.json keeps of a representation beside the run's own: featurisation, Gram, certificate."""
        return {"featurize": self.features.stats.to_dict(),
                "gram": {k: v for k, v in self.gram.stats.items() if k != "tile_detail"},
                "solver": SolverRecord.from_solution(self.sol, self.spec.normalize, self.spec.rank_bound).to_dict()}


def representation_config(cfg: RunConfig, representation: str) -> RunConfig:
    """The run's config with one of its representations as the representation."""
    features = dataclasses.replace(cfg.features, representation=representation, representations=None)
    return dataclasses.replace(cfg, features=features)


def vector_folder(run_dir: RunFolder, representation: str, primary: bool) -> RunFolder:
    """Where a representation's vectors live: vectors/ for the run's first, vectors-<name>/ for the others."""
    return run_dir.sub("vectors" if primary else f"vectors-{representation}")


def value(cfg: RunConfig, representation: str, data: PreparedData, store: VectorStore, replica: ReplicaSpec,
          tokenizer: Any, costs: np.ndarray | None, progress: Any, timer: Any, primary: bool,
          on_stage: Any = lambda name: None, prior: PriorRun | None = None) -> Valuation:
    """Featurise (into `store`), build the Gram and solve for one representation (the run's first: `primary`, its
    stages with the plain names; the others' stages `<stage>:<tag>`); incremental where `prior`, the run folder's
    earlier valuation, has rows of this pool (engine/driver/incremental.py)."""
    rcfg = representation_config(cfg, representation)
    suffix = "" if primary else f":{TAGS[representation]}"
    spec_r = dataclasses.replace(replica, features=rcfg.features)
    work = None
    if representation == "task_vector" and rcfg.features.tv_data == "group":
        work = full_items(data, tokenizer, cfg.model.max_length)
    on_stage("featurize")
    with timer.stage(f"featurize{suffix}"):
        features = featurize(rcfg, spec_r, data, store, progress, work=work, stage=f"featurize{suffix}")
    spec = SolveSpec.from_config(rcfg, costs=costs, rank_bound=int(features.g_tar.shape[0]),
                                 space=solver_space(rcfg, len(features.names)))
    on_stage("gram")
    done = value_rows(spec, features.names, features.blocks, features.refs, features.g_tar, timer, suffix,
                      prior=prior, on_stage=on_stage,
                      check=lambda gram: check_nonzero(rcfg, features.names, gram.row_norm2, features.g_tar))
    return Valuation(representation, rcfg, store, features, done.gram, done.spec, done.sol, done.state)
