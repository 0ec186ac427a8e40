"""The import rules of docs/architecture.md: the import-linter layers hold, and an import inside a function says why."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "actors", "solvers")

def _is_import(line: str) -> bool:
    return line.lstrip().startswith(("import ", "from "))


def _has_reason(lines: list[str], lineno: int) -> bool:
    """A `#` on the import's line, or a comment line directly above its contiguous block of imports."""
    if "#" in lines[lineno - 1]:
        return True
    j = lineno - 1  # index of the line above, walking up over the block's other (comment-free) imports and blanks
    while j > 0 and (_is_import(lines[j - 1]) or not lines[j - 1].strip()) and "#" not in lines[j - 1]:
        j -= 1
    above = lines[j - 1].strip() if j > 0 else ""
    return above.startswith("#") or (_is_import(above) and "#" in above)


def _unexplained_inner_imports(path: Path) -> list[str]:
    text = path.read_text()
    lines = text.split("\n")
    rel = path.relative_to(ROOT).as_posix()
    found = {}
    for fn in ast.walk(ast.parse(text, filename=rel)):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import | ast.ImportFrom) and not _has_reason(lines, node.lineno):
                    found[node.lineno] = f"{rel}:{lines[node.lineno - 1].strip()}"
    return [f"{where}  (line {n})" for n, where in sorted(found.items())]


def test_every_import_inside_a_function_says_why():
    files = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))
    assert len(files) > 50  # the walk found the packages
    offenders = [o for p in files for o in _unexplained_inner_imports(p)]
    assert not offenders, ("imports inside a function without a `# reason` comment (hoist a light one to the top "
                           "of the module):\n" + "\n".join(offenders))


def test_the_import_linter_layers_are_kept():
    r = subprocess.run([str(Path(sys.executable).parent / "lint-imports")], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "0 broken" in out, out[-3000:]
