"""Question/answer groups from DeepMind's mathematics_dataset, one per module (run as a child process:
`python -m convalue.engine.data.mathgen '{"include": [...] | null, "n": 64, "seed": 0}'` prints one JSON line)."""

from __future__ import annotations

import importlib
import itertools
import json
import random
import sys
import types
import zlib

import numpy as np


def _integral(x):
    return int(x) if isinstance(x, float) and x.is_integer() else x


_randrange = random.Random.randrange


def _randrange_integral_floats(self, start, stop=None, step=1):
    """random.randrange as before Python 3.12: an integral float (`10 ** 2 / 2`) counts as that integer."""
    return _randrange(self, _integral(start), None if stop is None else _integral(stop), _integral(step))


class _ItemsetArray(np.ndarray):
    """An ndarray with numpy 1's itemset, which numpy 2 removed and mathematics_dataset's polynomials call."""

    def itemset(self, *args) -> None:
        *index, value = args
        if len(index) == 1:  # itemset(i, v): a flat index; itemset((i, j), v): a full one
            index = np.unravel_index(index[0], self.shape) if isinstance(index[0], (int, np.integer)) else index[0]
        self[tuple(index)] = value


def itemset_works(a: np.ndarray) -> bool:
    """Whether a.itemset can be called: numpy 2.0-2.3 keep a stub that raises, so hasattr is not enough."""
    try:
        a.itemset(0, a.flat[0])
    except AttributeError:
        return False
    return True


class _NumpyWithItemset(types.ModuleType):
    """numpy for the polynomials module: zeros/empty return _ItemsetArray views, all else is numpy's."""

    def __getattr__(self, name: str):
        return getattr(np, name)

    @staticmethod
    def zeros(*args, **kwargs) -> np.ndarray:
        return np.zeros(*args, **kwargs).view(_ItemsetArray)

    @staticmethod
    def empty(*args, **kwargs) -> np.ndarray:
        return np.empty(*args, **kwargs).view(_ItemsetArray)


class _EntityOrder:
    """Creation numbers as the hashes of mathematics_dataset's composition entities.

    expand_entities shuffles list(set(entities)) with the seeded generator, but a set of objects hashed
    by address iterates in an order that differs between processes, so composed questions did too.
    """

    def __init__(self) -> None:
        self.counter = itertools.count()

    def install(self, entity_class: type) -> None:
        """Number every new entity_class instance and hash it by its number."""
        init = entity_class.__init__
        order = self

        def numbered_init(entity, *args, **kwargs):
            entity._convalue_order = next(order.counter)
            init(entity, *args, **kwargs)

        entity_class.__init__ = numbered_init
        entity_class.__hash__ = lambda entity: entity._convalue_order  # equality stays identity

    def restart(self) -> None:
        """Number from 0 again (before each module's stream)."""
        self.counter = itertools.count()


_ENTITY_ORDER = _EntityOrder()


def generators() -> dict[str, object]:
    """The package's training modules by flat name (e.g. `arithmetic__add_or_sub`)."""
    # shims for the 2019 code: sympy moved base_solution_linear; numpy 2 dropped np.object and ndarray.itemset;
    # Python 3.12 refuses the integral floats that numbers__round_number & co. pass to random.randint (the
    # draws are the same as on 3.11, which converted them).
    random.Random.randrange = _randrange_integral_floats
    importlib.import_module("sympy.solvers.diophantine")
    # sympy: the optional `demo` extra, only when the math source is generated
    from sympy.solvers.diophantine.diophantine import base_solution_linear

    sys.modules["sympy.solvers.diophantine"].base_solution_linear = base_solution_linear
    if "object" not in np.__dict__:
        np.object = object
    if not itemset_works(np.zeros(1)):  # numpy 2: the polynomials (and calculus) modules need it back
        # mathematics_dataset: the optional `demo` extra, only when the math source is generated
        from mathematics_dataset.sample import polynomials

        polynomials.np = _NumpyWithItemset("numpy")
    # mathematics_dataset: the optional `demo` extra, only when the math source is generated
    from mathematics_dataset.modules import modules
    from mathematics_dataset.util import composition

    _ENTITY_ORDER.install(composition.Entity)

    def flat(tree: dict, prefix: str = "") -> dict[str, object]:
        out = {}
        for k, v in tree.items():
            out.update(flat(v, f"{prefix}{k}__") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    return flat(modules.train(lambda r: r))


def generate(include: list[str] | None, n: int, seed: int) -> dict:
    """{"groups": {module: [[question, answer], ...]}, "broken": [...]} or {"error": message}."""
    gens = generators()
    # sympy: the optional `demo` extra, only when the math source is generated
    import sympy.core.random as sympy_random

    names = sorted(gens) if include is None else list(include)
    unknown = sorted(set(names) - set(gens))
    if unknown:
        return {"error": f"include names unknown module(s) {unknown}; it has {sorted(gens)}"}
    groups, broken = {}, []
    for name in names:
        stream = zlib.crc32(f"{seed}/{name}".encode())  # a module's data does not depend on the others
        random.seed(stream)
        np.random.seed(stream)
        sympy_random.seed(stream)  # sympy's own generator (randprime, nextprime draws), seeded from the OS otherwise
        _ENTITY_ORDER.restart()
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
    """Print generate's reply to the JSON request in argv[1] as one JSON line."""
    request = json.loads(sys.argv[1])
    print(json.dumps(generate(request["include"], int(request["n"]), int(request["seed"]))))


if __name__ == "__main__":
    main()
