"""Question/answer groups from DeepMind's mathematics_dataset, one per module (run as a child process:
`python -m engine.mathgen '{"include": [...] | null, "n": 64, "seed": 0}'` prints one JSON line)."""

from __future__ import annotations

import importlib
import json
import random
import sys
import zlib

import numpy as np


def generators() -> dict[str, object]:
    """The package's training modules by flat name (e.g. `arithmetic__add_or_sub`)."""
    # two shims for the 2019 code (see ../shared/notes): sympy moved base_solution_linear; numpy 2 dropped np.object
    importlib.import_module("sympy.solvers.diophantine")
    from sympy.solvers.diophantine.diophantine import base_solution_linear

    sys.modules["sympy.solvers.diophantine"].base_solution_linear = base_solution_linear
    if "object" not in np.__dict__:
        np.object = object
    from mathematics_dataset.modules import modules

    def flat(tree: dict, prefix: str = "") -> dict[str, object]:
        out = {}
        for k, v in tree.items():
            out.update(flat(v, f"{prefix}{k}__") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    return flat(modules.train(lambda r: r))


def generate(include: list[str] | None, n: int, seed: int) -> dict:
    """{"groups": {module: [[question, answer], ...]}, "broken": [...]} or {"error": message}."""
    gens = generators()
    names = sorted(gens) if include is None else list(include)
    unknown = sorted(set(names) - set(gens))
    if unknown:
        return {"error": f"include names unknown module(s) {unknown}; it has {sorted(gens)}"}
    groups, broken = {}, []
    for name in names:
        stream = zlib.crc32(f"{seed}/{name}".encode())  # a module's data does not depend on the others
        random.seed(stream)
        np.random.seed(stream)
        pairs = []
        for i in range(n):
            try:
                problem = gens[name]()
            except Exception as exc:  # a module broken under this numpy/sympy version
                if include is not None:
                    return {"error": f"module {name!r} failed at example {i}: {type(exc).__name__}: {exc}"}
                broken.append(name)  # listing every module: leave a broken one out, named in a warning
                break
            pairs.append([str(problem.question), str(problem.answer)])
        else:
            groups[name] = pairs
    return {"groups": groups, "broken": broken}


def main() -> None:
    request = json.loads(sys.argv[1])
    print(json.dumps(generate(request["include"], int(request["n"]), int(request["seed"]))))


if __name__ == "__main__":
    main()
