"""No import circle among the modules of ``sessionstore`` and ``spark_adapter``, counting
imports inside functions and under ``TYPE_CHECKING`` (they tie modules together just the same).
A package's ``__init__`` re-exports its modules, so it is left out as an importer."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sessionstore", "spark_adapter")


def module_names() -> dict[str, Path]:
    names = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names[".".join(parts)] = path
    return names


def imports(names: dict[str, Path]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, path in names.items():
        if path.name == "__init__.py":
            continue
        package = name.rsplit(".", 1)[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                candidates = [target] + [f"{target}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                continue
            found |= {c for c in candidates if c in names and names[c].name != "__init__.py"}
        edges[name] = found - {name}
    return edges


def circle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for other in sorted(edges.get(node, ())):
            if state.get(other) == 1:
                return path[path.index(other):] + [other]
            if other not in state and (found := visit(other)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_of_the_packages_imports_itself_through_others() -> None:
    assert circle(imports(module_names())) is None


def test_the_check_sees_a_circle_through_a_function_level_import() -> None:
    # the circle this check was written after: arrays imported kernels.compiled inside its
    # functions while kernels imported arrays at the top
    edges = imports(module_names())
    assert "sessionstore.arrays" in edges["sessionstore.kernels"]
    edges["sessionstore.arrays"].add("sessionstore.kernels")
    assert circle(edges) is not None
