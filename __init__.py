"""convalue: which candidate datasets are worth training on for a target task (KMM in gradient space, on Ray).

The public API is loaded on first use, so `import convalue` stays cheap (no torch, no Ray):

    import convalue
    cfg = convalue.load_config("examples/demo.yaml")
    summary = convalue.run(cfg)                              # the whole valuation on Ray
    sol = convalue.solve_kmm(K, beta, gamma=0.05)            # or only the KMM solve, from a Gram matrix
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("convalue")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

#: public name -> the module that defines it
_EXPORTS = {
    "run": "convalue.engine.driver.pipeline",
    "resolve": "convalue.engine.driver.resolve",
    "load_config": "convalue.engine.config",
    "config_from_dict": "convalue.engine.config",
    "RunConfig": "convalue.engine.config",
    "ConfigError": "convalue.engine.config",
    "solve_kmm": "convalue.solvers",
    "solve_kmm_gradients": "convalue.solvers",
    "kmm_path": "convalue.solvers",
    "kkt_violation": "convalue.solvers",
    "KMMSolution": "convalue.solvers",
    "KMMPath": "convalue.solvers",
    "KMMInputError": "convalue.solvers",
    "KMMSolveError": "convalue.solvers",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'convalue' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
