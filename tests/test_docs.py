"""The docs match the code: the config reference, the paths and API names they mention, the floors of pyproject's
ranges; and the README stays short and the docs free of run history (that goes to bench/RESULTS.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import convalue
from convalue.engine.config import reference_markdown

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_config_reference_is_current():
    assert _text(ROOT / "docs" / "config.md").strip() == reference_markdown().strip(), (
        "docs/config.md is out of date: regenerate it with `convalue config-reference > docs/config.md`")


def test_readme_is_short_and_starts_with_the_quick_start_commands():
    text = _text(README)
    assert len(text.splitlines()) <= 250, "README.md is for newcomers: at most 250 lines; move detail to docs/"
    assert "make demo" in text and "make test" in text


#: a time of day in UTC (12:34 UTC, 12:34–12:40 UTC)
UTC_TIME = re.compile(r"\b\d{1,2}:\d{2}\b[^\n]{0,12}?UTC")
#: a commit hash: 7 to 40 hex digits with at least one digit and one letter (an English word or a plain number is not one)
COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_hold_no_run_history(path):
    """A figure is quoted once, where it is current, with the command that reproduces it; when and at which commit
    it was measured belongs in bench/RESULTS.md."""
    text = _text(path)
    assert not UTC_TIME.findall(text), f"{path.name}: times of day belong in bench/RESULTS.md"
    assert not COMMIT.findall(text), f"{path.name}: commit hashes belong in bench/RESULTS.md"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_repository_paths_exist(path):
    """Every bench/, examples/ (and engine/, actors/, solvers/, cluster/, tests/) path the docs name is there, unless
    the text right after it says it was removed (`bench/x.py (removed; in git history)`)."""
    folders = "bench|examples|engine|actors|solvers|cluster|tests"
    text = _text(path)
    missing = set()
    for m in re.finditer(rf"(?<![\w./-])(?:{folders})/[\w./-]*", text):
        named = m.group().rstrip(".,:;)")
        if not (ROOT / named).exists() and "removed" not in text[m.end():m.end() + 40]:
            missing.add(named)
    assert not missing, f"{path.name} names files that do not exist: {sorted(missing)}"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_local_links_resolve(path):
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", _text(path))
    local = [link for link in links if "://" not in link]
    missing = sorted(link for link in local if not (path.parent / link).exists())
    assert not missing, f"{path.name} links to files that do not exist: {missing}"


def test_readme_python_api_names_exist():
    """Every convalue.NAME the README documents is public and imports."""
    names = set(re.findall(r"\bconvalue\.([A-Za-z_]\w*)", _text(README)))
    assert names <= set(convalue.__all__), f"README names convalue.{sorted(names - set(convalue.__all__))}"
    for name in sorted(names):
        assert getattr(convalue, name) is not None


def test_lowest_constraints_pin_every_floor_of_pyproject():
    """constraints-lowest.txt (make test-lowest) pins each runtime dependency, the core's and every runtime extra's, at
    pyproject's floor: a floor raised, or a dependency added, in one file and not the other fails here."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
        import tomli as tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = {name: [Requirement(r) for r in reqs] for name, reqs in project["optional-dependencies"].items()}
    # [all] names the runtime extras; [dev] holds the test tools and [bench] the bench scripts' rival libraries,
    # which are not floors of convalue's own
    listed = {e for r in extras["all"] if canonicalize_name(r.name) == "convalue" for e in r.extras}
    assert listed == set(extras) - {"all", "dev", "bench"}, "[all] must list every runtime extra"
    deps = [Requirement(r) for r in project["dependencies"]] + [r for e in sorted(listed) for r in extras[e]]
    lines = (ROOT / "constraints-lowest.txt").read_text().splitlines()
    pins = {canonicalize_name(n): Version(v) for n, v in
            (line.split("==") for line in lines if line.strip() and not line.startswith("#"))}
    assert set(pins) == {canonicalize_name(d.name) for d in deps}
    for d in deps:
        floor = next(Version(s.version) for s in d.specifier if s.operator == ">=")
        pin = pins[canonicalize_name(d.name)]
        assert pin in d.specifier and pin.release[:len(floor.release)] == floor.release, (d, pin)
