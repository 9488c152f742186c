"""parsim's and hw's modules import one another without a circle, and no module imports another's private names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).parent.parent
ROOT = REPO / "parsim"
PACKAGES = ("parsim", "hw")


def module_names(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package under root, by dotted name (a package by its own name, not `.__init__`)."""
    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported(tree: ast.AST, name: str, is_package: bool) -> set[str]:
    """Dotted names a module's imports load, inside functions too: `from a.b import c` loads a.b and a.b.c."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: `from ..x import y` counts up from the importing module's package
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (an import of a name inside a module is an edge to that module)."""
    names = module_names(root)
    graph = {}
    for name, path in names.items():
        targets = imported(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py")
        graph[name] = {t for t in targets if t in names and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph as a path that ends where it starts, or None: depth-first, colouring nodes."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_has_no_import_circle(package):
    graph = import_graph(REPO / package)
    assert len(graph) > 20  # the walk saw the whole package
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def private_imports(path: Path, known: set[str]) -> list[str]:
    """`from M import _x` and `M._x` where M is one of the project's modules: another module's private name."""
    tree = ast.parse(path.read_text(), str(path))
    aliases, found = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in known:
            found += [f"{node.module}.{a.name}" for a in node.names if private(a.name)]
            aliases |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names
                        if f"{node.module}.{a.name}" in known}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname: a.name for a in node.names if a.asname and a.name in known}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr) and isinstance(node.value, ast.Name) \
                and node.value.id in aliases:
            found.append(f"{aliases[node.value.id]}.{node.attr}")
    return found


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_imports_another_modules_private_names():
    known = {name for package in PACKAGES for name in module_names(REPO / package)}
    files = [f for folder in (*PACKAGES, "tests", "scripts", "benchmarks") for f in (REPO / folder).rglob("*.py")]
    found = {str(f.relative_to(REPO)): names for f in files if (names := private_imports(f, known))}
    assert found == {}


def test_the_schedule_generators_do_not_import_the_torch_importer():
    graph = import_graph()
    assert "parsim.schedules.from_torch" not in graph["parsim.schedules.generators"]
    assert "parsim.schedules.actions" in graph["parsim.schedules.from_torch"]


@pytest.mark.parametrize("files,cycle", [
    ({"a.py": "import pkg.b", "b.py": "x = 1"}, None),
    ({"a.py": "from pkg.b import x", "b.py": "def f():\n    from pkg.a import y\n"}, ["pkg.a", "pkg.b", "pkg.a"]),
    ({"a.py": "from . import b", "b.py": "from .a import y"}, ["pkg.a", "pkg.b", "pkg.a"]),
    ({"__init__.py": "from pkg import a", "a.py": "from pkg.sub.c import z", "sub/__init__.py": "",
      "sub/c.py": "from ..a import w"}, ["pkg.a", "pkg.sub.c", "pkg.a"]),
    ({"__init__.py": "from pkg import a", "a.py": "import os"}, None),  # a package importing its own module
])
def test_the_graph_sees_absolute_relative_and_function_level_imports(tmp_path, files, cycle):
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert find_cycle(import_graph(tmp_path / "pkg")) == cycle
