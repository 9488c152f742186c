"""parsim's modules import one another without a circle, so each layer reads on its own (issue 16)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent / "parsim"


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


def test_parsim_has_no_import_circle():
    graph = import_graph()
    assert len(graph) > 20 and "parsim.schedules.from_torch" in graph  # the walk saw the whole package
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


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
