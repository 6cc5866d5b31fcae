"""The package's layout: imports run one way (no circle among lltm_train's modules, imports inside functions
included) and no module imports another module's private name."""

from __future__ import annotations

import ast
from pathlib import Path

import lltm_train

PACKAGE = Path(lltm_train.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package (a package is its __init__)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _absolute(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of a (possibly relative) import made in ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _imports(modules: dict[str, Path]):
    """(importer, imported module, name or None) for every import statement, anywhere in each module."""
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield name, alias.name, None
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(name, is_package, node.level, node.module)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    yield name, (sub if sub in modules else base), (None if sub in modules else alias.name)


def _executed(importer: str, imported: str, modules: dict[str, Path]) -> list[str]:
    """The package's modules that an import runs: the module and each package above it that the importer is
    not itself inside (whose __init__ is then run first)."""
    parts = imported.split(".")
    out = []
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name in modules and not (importer == name or importer.startswith(name + ".")):
            out.append(name)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for importer, imported, _ in _imports(modules):
        graph[importer].update(_executed(importer, imported, modules))
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_checker_finds_a_circle_and_an_executed_package():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    modules = {"p": Path(), "p.q": Path(), "p.q.r": Path(), "p.s": Path()}
    assert _executed("p.s", "p.q.r", modules) == ["p.q", "p.q.r"]  # p.q's __init__ runs; p is already running


def test_no_import_circle():
    assert _cycles(_graph()) == []


def test_no_private_name_imported_across_modules():
    """``from .x import _name`` only within the package that holds x (its own private helpers), never from a
    module of another package or the top level."""
    modules = _modules()
    bad = []
    for importer, imported, name in _imports(modules):
        if not imported.startswith("lltm_train"):
            continue
        private_module = any(part.startswith("_") and not part.startswith("__") for part in imported.split("."))
        private_name = name is not None and name.startswith("_") and not name.startswith("__")
        if not (private_module or private_name):
            continue
        package = imported.rsplit(".", 1)[0] if imported in modules and modules[imported].name != "__init__.py" else imported
        if private_name and imported in modules and modules[imported].name != "__init__.py":
            bad.append(f"{importer} imports {imported}.{name}")
        elif private_module and not (importer == package or importer.startswith(package + ".")):
            bad.append(f"{importer} imports {imported}")
    assert bad == []
