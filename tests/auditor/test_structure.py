"""The auditor's structure: no import cycles, small modules, the exception tree drawn in the
package docstring, registries that agree with the plan, one protocol per mechanism."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import get_args

import dpicl_audit
from dpicl_audit import errors
from dpicl_audit.attacks import ATTACKS, attacks_for
from dpicl_audit.mechanisms.base import MechanismAudit
from dpicl_audit.mechanisms.registry import MECHANISMS
from dpicl_audit.mechanisms.names import mechanism_names
from dpicl_audit.plan import Attack

PACKAGE = Path(dpicl_audit.__file__).parent
#: Modules allowed past ~400 lines because they are one idea each.
ONE_IDEA = {
    "plan.py": "the plan model and its validation",
    "store.py": "the SQL trial log",
    "demo.py": "the demo script",
}
MAX_LINES = 400


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _top_level_imports(path: Path, known: set[str]) -> set[str]:
    """Modules of the package imported when ``path`` is imported (TYPE_CHECKING excluded,
    imports inside functions excluded: they run later)."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in known:
                out.add(node.module)
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if sub in known:
                    out.add(sub)
    return out


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(files)
    return {name: _top_level_imports(path, known) - {name} for name, path in files.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycles() -> None:
    graph = _graph()
    assert len(graph) > 30 and "dpicl_audit.mechanisms.voting" in graph
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_check_can_fail() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_modules_are_small() -> None:
    big = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert set(big) <= set(ONE_IDEA), f"modules over {MAX_LINES} lines: {big}"
    assert all(n < 1.5 * MAX_LINES for n in big.values()), big


def test_exception_tree_is_drawn_in_the_package_docstring() -> None:
    doc = dpicl_audit.__doc__ or ""
    for name in errors.__all__:
        assert f"── {name}" in doc, f"{name} is missing from the tree in dpicl_audit/__init__.py"
    for _, cls in inspect.getmembers(errors, inspect.isclass):
        if issubclass(cls, errors.AuditError) and cls is not errors.AuditError:
            assert cls.__name__ in errors.__all__


def test_registries_agree_with_the_plan() -> None:
    assert set(get_args(Attack)) == set(ATTACKS)
    assert set(mechanism_names()) == set(MECHANISMS)
    for name in MECHANISMS:
        assert attacks_for(name), f"no attack applies to {name}"
    for spec in ATTACKS.values():
        assert set(spec.mechanisms) <= set(MECHANISMS)


def test_every_mechanism_implements_the_protocol() -> None:
    required = ("build_design", "summary", "context_body", "trial")
    required += ("setting_meta", "estimate")
    for name, mech in MECHANISMS.items():
        assert mech.name == name and mech.task in ("classification", "generation")
        assert hasattr(mech.design_type, "from_json") and hasattr(mech.design_type, "to_json")
        for method in required:
            assert getattr(type(mech), method) is not getattr(MechanismAudit, method), (
                f"{name} does not implement {method}"
            )
