"""The house rules that a reading of the imports can check: the store imports nothing of the
engine's, and no module imports another's private names."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "sessionstore"


def _imports(path: Path) -> list[tuple[str, str]]:
    """``(module, name)`` of every ``from ... import`` in a file (relative ones resolved)."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found += [(target, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names]
    return found


def test_the_store_imports_nothing_of_the_engine() -> None:
    for path in (PACKAGE / "store").rglob("*.py"):
        for target, name in _imports(path):
            full = f"{target}.{name}" if name else target
            assert not full.startswith(("sessionstore.engine", "sessionstore.kernels",
                                        "sessionstore.folds")), (path.name, full)


def test_no_module_imports_another_modules_private_names() -> None:
    taken = [f"{path.relative_to(PACKAGE)} imports {name} from {target}"
             for path in PACKAGE.rglob("*.py") for target, name in _imports(path)
             if target.startswith("sessionstore") and name.startswith("_")
             and not name.startswith("__")]
    assert taken == []
