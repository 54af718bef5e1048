"""The layers of docs/architecture.md, held by parsing every import (ast; those inside functions too):
each package and root module imports only from its row of the diagram or the rows below it (the rows
are read from the diagram itself), runtime/ and ptx/ import (almost) nothing, verify/ and bench/ never
each other, and nothing a user installs imports the test-only kernalin_ci.testing. An import across a
layer turns CI red here, and so does an import cycle among kernalin_ci modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "kernalin_ci"

EVERYTHING = {
    p.name.removesuffix(".py") for p in PKG.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
} - {"__init__"}
DIAGRAM = PKG.parent / "docs" / "architecture.md"


def diagram_rows(text: str) -> list[set[str]]:
    """The rows of the layer diagram under "## Layers" in docs/architecture.md, top row first: the
    package (`gate/`) and module (`config.py`) names that begin each line."""
    block = text.split("## Layers", 1)[1].split("```", 2)[1]
    rows = []
    for line in block.splitlines():
        names = []
        for token in line.split():
            if not re.fullmatch(r"\w+(/|\.py),?", token):
                break
            names.append(token.rstrip(",").removesuffix("/").removesuffix(".py"))
        if names:
            rows.append(set(names))
    return rows


ROWS = diagram_rows(DIAGRAM.read_text())
ROW = {name: i for i, row in enumerate(ROWS) for name in row}  # 0: the top row
# stricter than the rows: what each part must never import (its first name below kernalin_ci)
FORBIDDEN = {
    "runtime": EVERYTHING - {"runtime", "lazy"},  # poisoning, interpreter patches, CUDA errors, rows
    "ptx": EVERYTHING - {"ptx"},  # the PTX engine: plain data in and out, plugged in by verify/structural
    "verify": {"bench"},
    "bench": {"verify"},
    "progress": EVERYTHING - {"progress"},  # typed events and their sinks: below everything that reports progress
}
SHIPPED_NEVER = {"testing"}  # excluded from the wheel (pyproject.toml): nothing installed may import it
# Known crossings, each with its reason; the test fails when one is no longer needed.
ALLOWED = {
    ("sandbox/workers.py", "cuda"): "each worker view gets its own CUDA build caches (cuda/caches.py)",
    ("jobs.py", "cuda"): "a job carries the CudaSpec of cuda/sources.py (plain data)",
    ("jobs.py", "throughput"): "a model-bench job carries the ModelSpec of throughput/spec.py (plain data)",
}


def imported(path: Path, pkg: Path = PKG) -> set[str]:
    """The kernalin_ci modules a file imports, as dotted names (relative imports resolved)."""
    here = path.relative_to(pkg.parent).with_suffix("").parts
    package = here if path.name == "__init__.py" else here[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if m == "kernalin_ci" or m.startswith("kernalin_ci.")}


def part(module: str) -> str | None:
    names = module.split(".")
    return names[1].removesuffix(".py") if len(names) > 1 else None


def crossings(pkg: Path) -> list[tuple[str, str, str]]:
    """(file, imported module, rule) for every import that breaks a layer rule."""
    bad = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).as_posix()
        mine = rel.split("/")[0].removesuffix(".py")
        for module in sorted(imported(path, pkg)):
            to = part(module)
            if to is None or to == mine or to not in EVERYTHING:  # `kernalin_ci.__version__`: the package's own
                continue
            if to in SHIPPED_NEVER and mine not in SHIPPED_NEVER:
                bad.append((rel, module, f"kernalin_ci.{to} is test-only: not in the wheel"))
            elif to in FORBIDDEN.get(mine, ()) or ROW.get(to, len(ROWS)) < ROW.get(mine, len(ROWS)):
                bad.append((rel, module, f"{mine}/ must not import {to}"))
    return bad


def test_the_diagram_places_every_package_and_root_module_once():
    """A new package or root module needs its row in docs/architecture.md's diagram (else it has no rule)."""
    placed = [name for row in ROWS for name in row]
    assert sorted(n for n in set(placed) if placed.count(n) > 1) == []
    assert set(placed) == EVERYTHING, (sorted(EVERYTHING - set(placed)), sorted(set(placed) - EVERYTHING))


def test_no_import_crosses_a_layer():
    found = crossings(PKG)
    unexplained = [b for b in found if (b[0], part(b[1])) not in ALLOWED]
    assert not unexplained, "\n".join(f"{f}: imports {m} ({why})" for f, m, why in unexplained)
    stale = set(ALLOWED) - {(f, part(m)) for f, m, _ in found}
    assert not stale, f"allowed crossings no longer made (delete them from ALLOWED): {sorted(stale)}"


def test_a_crossing_is_found_wherever_the_import_is_written(tmp_path):
    """The rule sees imports inside functions, relative ones and `import x.y` alike."""
    pkg = tmp_path / "kernalin_ci"
    for d in ("ops", "runtime", "verify", "testing"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "ops" / "a.py").write_text("def f():\n    from ..verify import judge\n")
    (pkg / "ops" / "b.py").write_text("import kernalin_ci.runtime.poison\n")
    (pkg / "runtime" / "c.py").write_text("import kernalin_ci.ops.base\n")
    (pkg / "verify" / "d.py").write_text("from kernalin_ci.testing import github_standin\n")
    assert crossings(pkg) == [
        ("ops/a.py", "kernalin_ci.verify", "ops/ must not import verify"),
        ("ops/a.py", "kernalin_ci.verify.judge", "ops/ must not import verify"),
        ("runtime/c.py", "kernalin_ci.ops.base", "runtime/ must not import ops"),
        ("verify/d.py", "kernalin_ci.testing", "kernalin_ci.testing is test-only: not in the wheel"),
        ("verify/d.py", "kernalin_ci.testing.github_standin", "kernalin_ci.testing is test-only: not in the wheel"),
    ]


def test_the_wheel_holds_no_test_only_package():
    """The packages setuptools puts in the wheel, by pyproject.toml's own find rule."""
    import tomllib
    from setuptools import find_packages

    rule = tomllib.loads((PKG.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    shipped = set(find_packages(str(PKG.parent), include=rule["include"], exclude=rule.get("exclude", ())))
    assert {"kernalin_ci", "kernalin_ci.runtime", "kernalin_ci.verify.structural"} <= shipped
    assert not {p for p in shipped if p.split(".")[:2] == ["kernalin_ci", "testing"]}, sorted(shipped)


def test_each_public_class_name_has_one_meaning():
    """A class name (Report, Op, Trace, ...) names one thing in the whole package, so a name read in a
    traceback or a review leads to one definition."""
    where: dict[str, list[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where.setdefault(node.name, []).append(path.relative_to(PKG).as_posix())
    assert {name: files for name, files in where.items() if len(files) > 1} == {}


def test_no_two_helper_modules_share_a_name():
    """interp.py, worker.py, harness.py, compare.py once each meant two things. A name may repeat only
    where it means the same kind of thing in each package (listed here); a new repeat fails."""
    same_role = {
        "__init__.py",
        "bench.py",  # the `bench` command / the throughput benchmark's parent side
        "catalogue.py",  # the `catalogue` command / the catalogue it runs
        "decode_step.py",  # an op / its structural analysis
        "kv_append.py",
        "rope.py",
        "errors.py",  # the errors of the package it sits in
        "model.py",  # the data model of its package
        "render.py",  # the text of its package
        "result.py",  # the typed result of its package's run (a leaf: what the report holds)
        "run.py",  # a command / the run of its package
        "post.py",  # the GitHub posting of its package (the gate's results, tune's suggestions)
        "store.py",  # the storage of its package
        "task.py",  # the worker task of its package
    }
    seen: dict[str, list[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        if path.name not in same_role:
            seen.setdefault(path.name, []).append(path.relative_to(PKG).as_posix())
    assert {name: files for name, files in seen.items() if len(files) > 1} == {}


OP_NAMED = re.compile(r"^(op|op_name|\w+_op|op_\w+)$")  # an identifier that holds an op's name


def op_name_comparisons(pkg: Path, names: tuple[str, ...]) -> list[str]:
    """`FILE:LINE` of every comparison with an op's name outside ops/: a literal dotted op name anywhere in a
    comparison (attention.decode_paged), or any op name compared with something that names an op (`cap.op`,
    `op_name`, `getattr(x, "op")`). What an op is belongs to its Op's attributes (paged_cache, rotates, ...)."""

    def literals(node: ast.expr) -> list[str]:
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return [x.value for x in items if isinstance(x, ast.Constant) and isinstance(x.value, str)]

    def names_an_op(node: ast.expr) -> bool:
        for x in ast.walk(node):
            ident = x.id if isinstance(x, ast.Name) else x.attr if isinstance(x, ast.Attribute) else None
            if isinstance(x, ast.Call) and isinstance(x.func, ast.Name) and x.func.id == "getattr":
                ident = next(iter(literals(x.args[1])), None) if len(x.args) > 1 else None
            if ident and OP_NAMED.match(ident):
                return True
        return False

    found = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).as_posix()
        if rel.startswith("ops/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            for i, side in enumerate(sides):
                ops = [s for s in literals(side) if s in names]
                others = sides[:i] + sides[i + 1 :]
                if any("." in s for s in ops) or (ops and any(names_an_op(o) for o in others)):
                    found.append(f"{rel}:{node.lineno}")
                    break
    return found


def test_no_code_outside_ops_compares_op_names():
    """Adding an op touches ops/ only: code elsewhere asks the Op what it is (a paged cache, a rotation, its place
    in the decode step: ops/roles.py) instead of comparing its name."""
    from kernalin_ci.ops import NAMES

    assert op_name_comparisons(PKG, NAMES) == []


def test_an_op_name_comparison_is_found(tmp_path):
    pkg = tmp_path / "kernalin_ci"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "ops" / "a.py").write_text('ok = op == "rope"\n')
    (pkg / "b.py").write_text(
        'x = cap.op == "attention.decode_paged"\n'
        'y = op_name in ("kv_append", "decode_step")\n'
        'z = getattr(view.capture, "op", None) == "decode_step"\n'
        'w = "attention.decode" != kind\n'
        'fine = "rope" in gate\n'
        'also_fine = role == "rope"\n'
    )
    names = ("attention.decode", "attention.decode_paged", "rope", "kv_append", "decode_step", "custom")
    assert op_name_comparisons(pkg, names) == ["b.py:1", "b.py:2", "b.py:3", "b.py:4"]


def import_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """Each kernalin_ci module (dotted; a package is its __init__) -> the kernalin_ci modules it imports, from
    every import statement, those inside functions too; `from a import b` imports module a.b where b is one.
    Imports under `if TYPE_CHECKING:` are left out: they never run (they are how an annotation names a type of
    a module that imports this one)."""

    def name(path: Path) -> str:
        parts = path.relative_to(pkg.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name(p): p for p in pkg.rglob("*.py")}

    def resolve(module: str) -> str | None:  # the module itself, or the package of a name defined in one
        while module and module not in modules:
            module = module.rpartition(".")[0]
        return module or None

    graph: dict[str, set[str]] = {}
    for me, path in modules.items():
        package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {
            id(x)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for stmt in node.body
            for x in ast.walk(stmt)
        }
        found: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package[: len(package) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        graph[me] = {m for m in map(resolve, found) if m is not None and m != me}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The sets of modules that import each other, directly or round a circle (the strongly connected
    components of more than one module: Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(tuple(sorted(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def test_no_import_cycle():
    """No two modules import each other, directly or round a circle, at module level or inside a function: a
    cycle hides the order of the layers (verify/'s dynamic, judge, support and its decode loop were one)."""
    found = import_cycles(import_graph(PKG))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_an_import_cycle_is_found_wherever_the_import_is_written(tmp_path):
    """A cycle through an import inside a function, a relative import or `from package import module` is
    one; an import under `if TYPE_CHECKING:` is not."""
    pkg = tmp_path / "kernalin_ci"
    (pkg / "v").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "v" / "__init__.py").write_text("")
    (pkg / "v" / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "v" / "b.py").write_text("from kernalin_ci.v.c import thing\n")
    (pkg / "v" / "c.py").write_text("import kernalin_ci.v.a\nthing = 1\n")
    (pkg / "v" / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .e import E\n")
    (pkg / "v" / "e.py").write_text("from kernalin_ci.v import d\nclass E: ...\n")
    assert import_cycles(import_graph(pkg)) == [("kernalin_ci.v.a", "kernalin_ci.v.b", "kernalin_ci.v.c")]


def _is_internal(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] == "kernalin_ci" for a in node.names)
    return bool(node.level) or (node.module or "").split(".")[0] == "kernalin_ci"


def undeclared_deferred_imports(pkg: Path) -> dict[str, list[int]]:
    """{file: [line, ...]} of every kernalin_ci import inside a function that does not say why it is there:
    a `# deferred: WHY` comment on the line above it, or above the block of imports it belongs to."""
    found: dict[str, list[int]] = {}
    for path in sorted(pkg.rglob("*.py")):
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines), str(path))
        covered = {
            n
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)
        }
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)) or not _is_internal(node):
                    continue
                above = node.lineno - 1
                while above in covered:  # an import of the same block: its comment heads the block
                    above -= 1
                if not (above and lines[above - 1].strip().startswith("# deferred:")):
                    found.setdefault(path.relative_to(pkg).as_posix(), []).append(node.lineno)
    return {f: sorted(set(ls)) for f, ls in found.items()}


def test_an_import_inside_a_function_says_why():
    """The import graph is read at the top of each module: a kernalin_ci import inside a function hides an
    arrow, so it stays there only for a reason written beside it (`# deferred:` torch in the parent, the
    CLI's startup, an optional dependency, an import cycle)."""
    found = undeclared_deferred_imports(PKG)
    assert found == {}


def test_an_undeclared_deferred_import_is_found(tmp_path):
    pkg = tmp_path / "kernalin_ci"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "from kernalin_ci import top\n"
        "import json\n"
        "def f():\n"
        "    import os\n"  # not ours: not the rule's
        "    from kernalin_ci.x import y\n"  # 5: no reason
        "def g():\n"
        "    # deferred: an import cycle\n"
        "    from kernalin_ci.x import (\n"
        "        y,\n"
        "    )\n"
        "    from . import z\n"  # the same block: the comment above it holds
        "\n"
        "    from .w import v\n"  # 13: another block
        "    def h():\n"
        "        import kernalin_ci.q\n"  # 15: a nested function too
    )
    assert undeclared_deferred_imports(pkg) == {"a.py": [5, 13, 15]}


DEVICE_NAMES = ("cpu", "cuda")


def device_name_comparisons(pkg: Path) -> dict[str, list[int]]:
    """{file: [line, ...]} of every comparison of a device with a device's name ("cpu", "cuda") outside
    device.py: a name literal on one side, something that names a device (`device`, `self.device`,
    `req.slot.device`, `dev.name`) on another."""

    def literals(node: ast.expr) -> list[str]:
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return [x.value for x in items if isinstance(x, ast.Constant) and isinstance(x.value, str)]

    def names_a_device(node: ast.expr) -> bool:
        for x in ast.walk(node):
            ident = x.id if isinstance(x, ast.Name) else x.attr if isinstance(x, ast.Attribute) else ""
            if "device" in ident.lower() or ident == "dev":
                return True
        return False

    found: dict[str, list[int]] = {}
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).as_posix()
        if rel == "device.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            for i, side in enumerate(sides):
                if any(s in DEVICE_NAMES for s in literals(side)) and any(
                    names_a_device(o) for o in sides[:i] + sides[i + 1 :]
                ):
                    found.setdefault(rel, []).append(node.lineno)
                    break
    return {f: sorted(ls) for f, ls in found.items()}


def test_no_code_outside_device_py_compares_device_names():
    """What differs per device is asked of its Device (kernalin_ci/device.py: `gpu`, `interpreted`,
    `timed`, ...), never of its name: a third device is one more Device, not a hunt for `== "cuda"`."""
    assert device_name_comparisons(PKG) == {}


def test_a_device_name_comparison_is_found(tmp_path):
    pkg = tmp_path / "kernalin_ci"
    pkg.mkdir()
    (pkg / "device.py").write_text('gpu = name == "cuda"\n')  # device.py itself may
    (pkg / "b.py").write_text(
        'a = device == "cuda"\n'
        'b = "cpu" != self.device\n'
        'c = req.slot.device in ("cuda",)\n'
        'd = dev.name == "cpu"\n'
        'fine = name == "cuda"\n'  # a config key, not a device
        "also_fine = DEVICES[device].gpu\n"
    )
    assert device_name_comparisons(pkg) == {"b.py": [1, 2, 3, 4]}


MAX_MODULE_LINES = 800  # issue 34: a module that grows past this is split by concern, not let grow


def oversized(root: Path) -> list[str]:
    return [
        f"{p.relative_to(root.parent)}: {n} lines"
        for p in sorted(root.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]


def test_no_module_is_above_800_lines():
    assert oversized(PKG) == []


def test_an_oversized_module_is_found(tmp_path):
    pkg = tmp_path / "kernalin_ci"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "sub" / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (pkg / "small.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    assert oversized(pkg) == [f"kernalin_ci/sub/big.py: {MAX_MODULE_LINES + 1} lines"]
