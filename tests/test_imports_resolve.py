"""Every `import kernalin_ci...` and `from kernalin_ci... import X` written in kernalin_ci/, benchmarks/ and
tests/ (inside functions too, so in GPU-only branches that CPU CI never runs) names a module that exists
and, for `from`, a name that module has (or a submodule of it). A rename that leaves a stale import
behind turns CI red here instead of on the GPU machine.

The modules are imported for real (importlib), on the CPU; none of kernalin_ci's modules needs a GPU
to import."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ("kernalin_ci", "benchmarks", "tests")


def kernalin_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name or None) for every kernalin_ci import in a file; relative imports resolved."""
    rel = path.relative_to(ROOT).with_suffix("").parts
    package = rel if path.name == "__init__.py" else rel[:-1]
    out: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] == "kernalin_ci"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            if base.split(".")[0] == "kernalin_ci":
                out += [(node.lineno, base, a.name) for a in node.names if a.name != "*"]
    return out


def unresolved(files: list[Path]) -> list[str]:
    """`path:line: what` for each import that names a missing module or a name its module lacks."""
    bad: list[str] = []
    for path in files:
        where = path.relative_to(ROOT)
        for line, module, name in kernalin_imports(path):
            try:
                mod = importlib.import_module(module)
            except ModuleNotFoundError as e:
                bad.append(f"{where}:{line}: no module {module} ({e})")
                continue
            if name is None or hasattr(mod, name):
                continue
            if not hasattr(mod, "__path__") or importlib.util.find_spec(f"{module}.{name}") is None:
                bad.append(f"{where}:{line}: {module} has no {name}")
    return bad


def test_every_kernalin_import_resolves():
    files = sorted(p for tree in TREES for p in (ROOT / tree).rglob("*.py"))
    assert len(files) > 100, "the trees were not found"
    bad = unresolved(files)
    assert not bad, "stale imports (a rename left them behind):\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "text",
    [
        "def gpu_only():\n    from kernalin_ci.bench.harness import Runner\n",
        "def gpu_only():\n    from kernalin_ci.bench.timing import Runner\n",
        "import kernalin_ci.worker\n",
        "def f():\n    from .structural import interp\n",
    ],
)
def test_a_stale_import_is_found_wherever_it_is_written(tmp_path, text):
    # a file placed as if it were kernalin_ci/verify/probe.py (relative imports resolve against it)
    pkg = tmp_path / "kernalin_ci" / "verify"
    pkg.mkdir(parents=True)
    probe = pkg / "probe.py"
    probe.write_text(text)
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert len(unresolved([probe])) == 1
    finally:
        ROOT = saved


def test_a_good_import_passes(tmp_path):
    pkg = tmp_path / "kernalin_ci" / "verify"
    pkg.mkdir(parents=True)
    probe = pkg / "probe.py"
    probe.write_text("def f():\n    from kernalin_ci.bench.timing import TimedEntry\n    from .structural import ir\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert unresolved([probe]) == []
    finally:
        ROOT = saved
