"""The checks a run and `convalue score` share before and around valuing, and the solver space they choose; no Ray,
so `convalue score` certifying a prior in the driver loads none."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from convalue.engine.config import ConfigError, RunConfig
from convalue.engine.features.projection import check_projection_fits
from convalue.engine.files.folder import RunFolder
from convalue.engine.model.loading import featurised_count

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


def check_projection(cfg: RunConfig, model_dir: Path) -> None:
    """Refuse a projection.dim above the parameters a representation featurises, read from the checkpoint's shapes
    before any worker loads the model (where the shapes cannot tell, the workers still refuse it)."""
    for representation in cfg.features.representations or [cfg.features.representation]:
        n = featurised_count(model_dir, cfg.lora, cfg.features.parameters, with_a=representation == "task_vector")
        if n is not None:
            check_projection_fits(cfg.projection.kind, n, cfg.projection.dim)
