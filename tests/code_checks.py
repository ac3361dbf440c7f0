"""Checks of a package's source that both sides' structure tests run (issue 38): modules that
keep an old path alive, functions longer than a screen, and lines of the core that test a
mechanism's name. Each reads the source's syntax tree, so an import inside a function or a
comparison written any way round is seen."""

from __future__ import annotations

import ast
from pathlib import Path


def aliases_itself(tree: ast.Module) -> bool:
    """Whether a module assigns ``sys.modules[...]``: a shim that makes an old path another
    module."""
    return any(
        isinstance(node, ast.Assign)
        and any(
            isinstance(t, ast.Subscript) and ast.unparse(t.value) == "sys.modules"
            for t in node.targets
        )
        for node in ast.walk(tree)
    )


def only_reexports(tree: ast.Module) -> bool:
    """Whether a module holds nothing but imports (and ``__all__``): the old home of names
    that live elsewhere. A package's ``__init__`` and a ``__main__`` may (the caller skips
    them): they are the package's face and its entry point, not an old path."""
    body = [
        node
        for node in tree.body
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
    ]
    return bool(body) and all(
        isinstance(node, ast.Import | ast.ImportFrom)
        or (
            isinstance(node, ast.Assign)
            and all(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        )
        for node in body
    )


def old_paths(root: Path) -> list[str]:
    """The modules under ``root`` that alias an old path or only re-export."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        reexports = path.name not in ("__init__.py", "__main__.py") and only_reexports(tree)
        if aliases_itself(tree) or reexports:
            found.append(str(path.relative_to(root)))
    return found


def long_functions(root: Path, limit: int) -> list[str]:
    """Every function (methods and nested ones included) longer than ``limit`` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines})")
    return found


def names_a_mechanism(tree: ast.Module, names: set[str]) -> list[int]:
    """Lines of ``tree`` that test something against a mechanism's name: a comparison
    (``==``, ``!=``, ``in``, either side) or a ``match`` case that holds the name."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            tested: ast.AST = node
        elif isinstance(node, ast.match_case):
            tested = node.pattern
        else:
            continue
        if any(isinstance(p, ast.Constant) and p.value in names for p in ast.walk(tested)):
            lines.add(getattr(tested, "lineno", 0))
    return sorted(lines)


def core_modules(root: Path) -> list[tuple[str, ast.Module]]:
    """The modules under ``root`` outside its ``mechanisms/`` folder, parsed."""
    return [
        (str(p.relative_to(root)), ast.parse(p.read_text()))
        for p in sorted(root.rglob("*.py"))
        if "mechanisms" not in p.relative_to(root).parts
    ]
