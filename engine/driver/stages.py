"""The valuation stages of one representation — featurise, Gram, solve — as one function with a typed result, and
the checks they share; the driver runs it once per representation of the run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from convalue.engine.config import RunConfig
from convalue.engine.data.prepare import PreparedData, full_items
from convalue.engine.driver.checks import TAGS, check_nonzero, solver_space
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
