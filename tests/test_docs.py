"""The docs match the code: the config reference, and the floors of pyproject's ranges."""

from __future__ import annotations

from pathlib import Path

from convalue.engine.config import reference_markdown

ROOT = Path(__file__).parents[1]


def test_readme_config_reference_is_current():
    readme = ROOT.joinpath("README.md").read_text(encoding="utf-8")
    start = readme.index("<!-- config-reference:start -->") + len("<!-- config-reference:start -->")
    end = readme.index("<!-- config-reference:end -->")
    assert readme[start:end].strip() == reference_markdown().strip(), "run `convalue config-reference` into README"


def test_lowest_constraints_pin_every_floor_of_pyproject():
    """constraints-lowest.txt (make test-lowest) pins each runtime dependency at pyproject's floor: a floor raised, or
    a dependency added, in one file and not the other fails here."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
        import tomli as tomllib

    deps = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    lines = (ROOT / "constraints-lowest.txt").read_text().splitlines()
    pins = {canonicalize_name(n): Version(v) for n, v in
            (line.split("==") for line in lines if line.strip() and not line.startswith("#"))}
    assert set(pins) == {canonicalize_name(d.name) for d in deps}
    for d in deps:
        floor = next(Version(s.version) for s in d.specifier if s.operator == ">=")
        pin = pins[canonicalize_name(d.name)]
        assert pin in d.specifier and pin.release[:len(floor.release)] == floor.release, (d, pin)
