"""The valuation stages of one representation — featurise, Gram, solve — as one function with a typed result, and
the checks they share; the driver runs it once per representation of the run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from convalue.actors.gram import build_gram
from convalue.actors.sharded import problem_of, solve_sharded_on_actor
from convalue.actors.solver import solve_blocks_on_actor, solve_on_actor
from convalue.engine.config import ConfigError, RunConfig
from convalue.engine.data.prepare import PreparedData, full_items
from convalue.engine.driver.featurize import FeaturizeResult, featurize
from convalue.engine.files.folder import RunFolder
from convalue.engine.model.spec import ReplicaSpec
from convalue.engine.selection.blocked import GramResult, panels_of
from convalue.engine.selection.solve import KMMProblemData, SolveSpec
from convalue.engine.store.summary import SolverRecord
from convalue.engine.store.vectors import VectorStore
from convalue.solvers import KMMSolution
from convalue.solvers.sharded import DEFAULT_SHARD_POLICY, ShardPolicy

#: solver.space `auto` solves in gradient space above this many candidates (K would not fit in memory)
GRADIENT_SPACE_MIN_N = 20_000
#: how a representation names its methods in the evaluation (`tv`, `tv+kmm`, ...)
TAGS = {"one_step": "one_step", "task_vector": "tv", "grpo": "grpo"}


def solver_space(cfg: RunConfig, n: int) -> str:
    """`gram` or `gradients` (solver.space, with `auto` choosing gradients above GRADIENT_SPACE_MIN_N)."""
    if cfg.solver.space != "auto":
        return cfg.solver.space
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


def gram_stage_of(spec: SolveSpec, features: FeaturizeResult) -> GramResult:
    """beta, the cosine and (in Gram space) K = G G^T in the run's metric, from tile tasks over the stored blocks."""
    return build_gram(features.blocks, features.refs, len(features.names), features.g_tar, spec.metric,
                      with_K=spec.space == "gram")


def solve_stage(spec: SolveSpec, features: FeaturizeResult, gram: GramResult,
                shard: ShardPolicy = DEFAULT_SHARD_POLICY) -> KMMSolution:
    """The KMM solve on a solver actor: from K in Gram space; else from the vectors gathered on a worker where all
    of G fits the shard policy, or from G left in its blocks (the sharded solve: gram.stats["sharded"] says where G
    lived and what moved)."""
    if gram.K is not None:
        return solve_on_actor(spec, KMMProblemData(beta=gram.beta, K=gram.K, G=None, g_tar=None, M=gram.M))
    n, p = len(features.names), int(features.g_tar.shape[0])
    if shard.holds_all(n, p):
        return solve_blocks_on_actor(spec, features.blocks, features.refs, n, features.g_tar)
    sol, stats = solve_sharded_on_actor(problem_of(spec, n, features.g_tar, gram, shard),
                                        panels_of(features.blocks), features.refs)
    gram.stats["sharded"] = stats | sol.info["sharded"]
    return sol


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
          on_stage: Any = lambda name: None) -> Valuation:
    """Featurise (into `store`), build the Gram and solve for one representation (the run's first: `primary`, its
    stages with the plain names; the others' stages `<stage>:<tag>`)."""
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
    with timer.stage(f"gram{suffix}"):
        gram = gram_stage_of(spec, features)
        check_nonzero(rcfg, features.names, gram.row_norm2, features.g_tar)
    spec = spec.resolved(gram.beta, gram.diag)  # gamma_ratio -> this problem's absolute gamma
    on_stage("solve")
    with timer.stage(f"solve{suffix}"):
        sol = solve_stage(spec, features, gram)
    return Valuation(representation, rcfg, store, features, gram, spec, sol)
