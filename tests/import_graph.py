"""The import graph of one package, read with every import counted.

An import inside a function, under ``TYPE_CHECKING`` or relative still ties two modules
together: the reader must hold both in mind, and a later refactor that hoists it makes a
cycle at import time. So the structure tests count all of them (issue 28).

An edge ``a -> b`` means module ``a`` names module ``b`` in an ``import``: ``import b``,
``from b import x``, or ``from p import b`` where ``b`` is the submodule ``p.b``. Parents
imported implicitly on the way to a submodule are not edges; ``from p import x``, where
``x`` is not a module, is an edge to the package ``p`` (its ``__init__``).

Run as a script to print the cycles: ``python tests/import_graph.py services/dpicl``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str | None, level: int, current: str, is_package: bool) -> str:
    if level == 0:
        return module or ""
    base = current.split(".")
    # A module's relative import is against its package; a package's is against itself.
    drop = level - 1 if is_package else level
    base = base[: len(base) - drop] if drop else base
    return ".".join([*base, module] if module else base)


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """Every module of ``known`` that ``path`` (module ``name``) imports, anywhere in it."""
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node.module, node.level, name, is_package)
            named_modules = {f"{target}.{a.name}" for a in node.names} & known
            out |= named_modules
            if target in known and len(named_modules) < len(node.names):
                out.add(target)
    return out - {name}


def graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, for the package at ``root``."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    known = set(files)
    return {name: imports_of(path, name, known) for name, path in files.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def connect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                connect(w)
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
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(g):
            if v not in index:
                connect(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def in_function_imports(root: Path) -> int:
    """How many imports of the package itself sit inside a function or class body."""
    prefix = root.name
    count = 0
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.ImportFrom)
                    and (node.level > 0 or (node.module or "").split(".")[0] == prefix)
                ) or (
                    isinstance(node, ast.Import)
                    and any(a.name.split(".")[0] == prefix for a in node.names)
                ):
                    count += 1
    return count


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        root = Path(arg).resolve()
        found = cycles(graph(root))
        print(f"{root.name}: {len(found)} cycles, {in_function_imports(root)} in-function imports")
        for component in found:
            print("  ", " <-> ".join(component))
