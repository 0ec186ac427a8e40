"""The solver section: the KMM quadratic program's method, space, normalisation, costs and tolerance."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from convalue.engine.config.fields import ConfigError, check_readable, opt


@dataclass(kw_only=True)
class SolverConfig:
    """The KMM quadratic program."""

    gamma: float | None = opt(None, "l1 penalty of the penalised form (paper eq. kmm_l1_penalized).")
    gamma_ratio: float | None = opt(
        None, "The penalised form's gamma as a fraction of the smallest gamma that zeroes every score: gamma = "
        "gamma_ratio * max_i |beta_i| / (c_i sqrt(K_ii)), with beta and K in the run's metric, sqrt(K_ii) only with "
        "`normalize: cosine` and the prices c_i only with a `costs_file`; so it lies in [0, 1) (1 or more would give "
        "all-zero scores) and a ratio carries over between runs whose gradients differ in scale. The run records the gamma it used.")
    budget: float | None = opt(None, "k of the budget form ||w||_1 <= k (paper eq. kmm_qp).")
    method: Literal["auto", "active_set", "cvxpy", "cvxpy_paper"] = opt(
        "auto", "`auto`/`active_set`: convalue's exact active-set solver; `cvxpy`: the CVXPY + OSQP reference "
        "(tight tolerances); `cvxpy_paper`: CVXPY + OSQP called as the paper does.")
    space: Literal["auto", "gram", "gradients"] = opt(
        "auto", "`gram`: form K = G G^T (written to gram.npy); `gradients`: solve from the stored vectors, K formed only "
        "on the active set (for pools whose N x N Gram does not fit in memory; whole and in memory at a dense "
        "gamma with N <= p, where it is no larger than the vectors), no gram.npy; `auto`: `gradients` above "
        "20,000 candidates.")
    normalize: Literal["none", "cosine"] = opt(
        "none", "`cosine` divides K_ij by sqrt(K_ii K_jj) and beta_i by sqrt(K_ii), removing gradient norms.")
    costs_file: str | None = opt(
        None, "Prices per candidate, a JSON object {group: price} or a Parquet file (group, cost): the l1 term "
        "becomes sum_i c_i |w_i| (with `budget`: the marketplace's cost-weighted budget). Every candidate needs "
        "exactly one price > 0; a group priced twice is an error. A relative path is read against the config "
        "file's folder.")
    tol: float | None = opt(
        None, "With `gamma` or `gamma_ratio`: the KKT violation (relative to max(1, max|beta|)) at which convalue's solver may stop "
        "instead of polishing to round-off, in (0, 0.001]; dense solutions on a well-conditioned K then finish ADMM "
        "early; every other answer stays exact. null: exact. Not with `budget` or the CVXPY methods.")
    path: bool = opt(False, "Also solve the whole regularisation path (gamma from the largest that zeroes every score "
                            "down to 1e-3 of it, warm-started; Gram space only) and write path.parquet and path.png "
                            "(scores against gamma); with fine-tunes, method `kmm_path` buys each k of finetune.ks at "
                            "the largest gamma where k candidates score above zero (paper Fig. l1_comparison).")
    path_points: int = opt(50, "Points of the path's gamma grid.")

    def validate(self) -> None:
        """Raise ConfigError naming the first field whose value does not hold."""
        if self.path and self.space == "gradients":
            raise ConfigError("needs the Gram matrix: use `space: gram` or `auto` with it", field="path",
                              value=self.path)
        if self.path_points < 2:
            raise ConfigError("must be >= 2", field="path_points", value=self.path_points)
        if self.space == "gradients" and self.method.startswith("cvxpy"):
            raise ConfigError("the CVXPY reference needs the Gram matrix: use `space: gram` with it",
                              field="method", value=self.method)
        if self.method.startswith("cvxpy") and importlib.util.find_spec("cvxpy") is None:
            raise ConfigError("needs CVXPY and OSQP: pip install 'convalue[reference]'", field="method",
                              value=self.method)
        if self.costs_file is not None and not Path(self.costs_file).expanduser().is_file():
            raise ConfigError("is not an existing file", field="costs_file", value=self.costs_file)
        if self.costs_file is not None:
            check_readable(Path(self.costs_file).expanduser(), "costs_file", self.costs_file)
        forms = {"gamma": self.gamma, "gamma_ratio": self.gamma_ratio, "budget": self.budget}
        if sum(v is not None for v in forms.values()) != 1:
            raise ConfigError("give exactly one of `gamma`, `gamma_ratio` or `budget`", field="gamma", value=forms)
        for name in ("gamma", "gamma_ratio"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise ConfigError("must be a finite number >= 0", field=name, value=value)
        if self.gamma_ratio is not None and self.gamma_ratio >= 1:
            raise ConfigError("must be in [0, 1): at 1 or more every score is 0", field="gamma_ratio",
                              value=self.gamma_ratio)
        if self.budget is not None and (not math.isfinite(self.budget) or self.budget <= 0):
            raise ConfigError("must be a finite number > 0", field="budget", value=self.budget)
        if self.tol is not None:
            if isinstance(self.tol, bool) or not math.isfinite(self.tol) or not 0 < self.tol <= 1e-3:
                raise ConfigError("must be a number in (0, 0.001]", field="tol", value=self.tol)
            if self.budget is not None:
                raise ConfigError("applies to the penalised form (`gamma`) only: the budget form is solved exactly",
                                  field="tol", value=self.tol)
            if self.method.startswith("cvxpy"):
                raise ConfigError(f"applies to convalue's solver, not to method {self.method!r}", field="tol",
                                  value=self.tol)
