"""No import circle among the modules of ``sessionstore/engine``: imports inside functions and
under ``TYPE_CHECKING`` count too, since they tie the modules together just the same (the paths
are typed against ``engine.host.EngineHost``, not against the aggregator that imports them)."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "sessionstore" / "engine"


def engine_imports() -> dict[str, set[str]]:
    """For each module of the engine package, the other modules of it that it imports."""
    modules = {path.stem for path in ENGINE.glob("*.py") if path.stem != "__init__"}
    edges: dict[str, set[str]] = {}
    for name in modules:
        found = set()
        for node in ast.walk(ast.parse((ENGINE / f"{name}.py").read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module in modules:  # from .x import y
                    found.add(node.module)
                elif node.module is None:  # from . import x
                    found |= {alias.name for alias in node.names if alias.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                parts = node.module.split(".")
                if parts[:2] == ["sessionstore", "engine"] and len(parts) > 2 \
                        and parts[2] in modules:
                    found.add(parts[2])
        edges[name] = found - {name}
    return edges


def find_circle(edges: dict[str, set[str]]) -> list[str] | None:
    """A list of modules that import each other in a circle, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                circle = visit(nxt)
                if circle:
                    return circle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            circle = visit(node)
            if circle:
                return circle
    return None


def test_no_import_circle_in_the_engine() -> None:
    assert find_circle(engine_imports()) is None


def test_the_circle_finder_finds_one() -> None:
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) is None
