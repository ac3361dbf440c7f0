"""The server's structure (issue 28, item 6): no import cycles between its modules, with every
import counted (inside functions, under TYPE_CHECKING, relative: tests/import_graph.py), and
the engines and the store below everything else."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import dpicl
from tests.import_graph import cycles, graph

PACKAGE = Path(dpicl.__file__).resolve().parent

#: What each lower layer may import from the rest of the package (beside itself).
LAYERS = {
    "dpicl.engines": {"dpicl.config", "dpicl.errors", "dpicl.metrics"},
    "dpicl.store": {"dpicl.errors", "dpicl.metrics"},
}

#: The transformers engine's helpers: they take a model runner, never the engine.
HELPERS = ("decoding", "generation", "past", "scoring")


def _format(found: list[list[str]]) -> str:
    return "\n".join(" <-> ".join(component) for component in found)


def test_no_import_cycles() -> None:
    g = graph(PACKAGE)
    assert len(g) > 50 and "dpicl.store.repository" in g and "dpicl.engines.runner" in g
    found = cycles(g)
    assert found == [], f"import cycles in services/dpicl:\n{_format(found)}"


def test_engines_and_store_import_only_what_lies_below() -> None:
    g = graph(PACKAGE)
    for layer, allowed in LAYERS.items():
        outside = {
            (m, t)
            for m, targets in g.items()
            if m == layer or m.startswith(layer + ".")
            for t in targets
            if not (t == layer or t.startswith(layer + ".")) and t not in allowed
        }
        assert not outside, f"{layer} imports from above it: {sorted(outside)}"


def test_the_transformers_helpers_never_import_the_engine() -> None:
    g = graph(PACKAGE)
    for helper in HELPERS:
        imported = g[f"dpicl.engines.transformers_{helper}"]
        assert "dpicl.engines.transformers" not in imported, helper
        if helper != "past":
            assert "dpicl.engines.runner" in imported, helper
    assert "dpicl.store.repository" not in g["dpicl.store.context_cache"]


def test_the_cycle_check_can_fail(tmp_path: Path) -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    # A cycle closed only by an import inside a function, or only under TYPE_CHECKING, is
    # still a cycle: the two shapes the engines and the store had (issue 28).
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "engine.py").write_text("from pkg.helper import run\n")
    (pkg / "helper.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.engine import Engine\n"
        "def run() -> None:\n"
        "    from pkg import late\n"
    )
    (pkg / "late.py").write_text("from . import helper\n")
    (pkg / "leaf.py").write_text("import pkg.engine\n")
    assert cycles(graph(pkg)) == [["pkg.engine", "pkg.helper", "pkg.late"]]


def _aliases_itself(tree: ast.Module) -> bool:
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


def test_no_module_keeps_an_old_path_alive() -> None:
    # Issue 38, item 3: every import names the real module; an old path fails loudly.
    shims = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if _aliases_itself(ast.parse(p.read_text()))
    )
    assert shims == [], f"modules that alias an old path: {shims}"
    for old in ("dpicl.pipelines.voting", "dpicl.mechanisms.mozo", "dpicl.privacy.mozo_proven"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    # The check can fail: the shape the 8 shims had.
    assert _aliases_itself(
        ast.parse("import sys\nimport m as _moved\nsys.modules[__name__] = _moved\n")
    )
