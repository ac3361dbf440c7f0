"""The server's structure (issue 28, item 6; issue 38): no import cycles between its modules,
with every import counted (inside functions, under TYPE_CHECKING, relative:
tests/import_graph.py), layers that only go down (the engines and the store below everything
else), the mechanisms' folders reached only through the registry, and no old paths."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import dpicl
from dpicl.mechanisms.registry import MECHANISMS
from tests.code_checks import (
    aliases_itself,
    core_modules,
    long_functions,
    names_a_mechanism,
    old_paths,
)
from tests.import_graph import cycles, graph

PACKAGE = Path(dpicl.__file__).resolve().parent

#: What each lower layer may import from the rest of the package (beside itself).
LAYERS = {
    # logging_setup: the engine process (engines/process/main.py) configures its own logging.
    "dpicl.engines": {"dpicl.config", "dpicl.errors", "dpicl.metrics", "dpicl.logging_setup"},
    "dpicl.store": {"dpicl.errors", "dpicl.metrics"},
}

#: The layers, bottom up, one entry per folder or top-level module of ``dpicl``: a module
#: imports only modules of lower layers, or of its own entry. A module is placed by its
#: folder (its first name below ``dpicl``), file by file: no file is carved out of its folder
#: (issue 48: ``api/deps.py`` and ``api/schemas.py`` were listed below the mechanisms while
#: their folder stood above them).
SERVER_LAYERS: tuple[tuple[str, ...], ...] = (
    ("dpicl", "errors"),
    ("domain", "metrics", "logging_setup"),
    ("config",),
    ("engines", "store"),
    ("prompts", "privacy"),
    # The kit the mechanisms' pipelines use (partitions, prompts, pay first): no mechanism.
    ("pipelines",),
    # The route kit: what any route needs, whoever contributes it (the app or a mechanism's
    # folder): the running services and who a token acts for, the shared shapes.
    ("web",),
    ("mechanisms",),
    # The body of POST /v1/contexts (the union of the registered settings).
    ("spec",),
    # What the server does for a request, whichever surface asked: create a context (which
    # calibrates it by its mechanism), answer a query, list contexts.
    ("serving",),
    ("api",),
    ("cli",),
    ("__main__",),
)

#: The mechanisms' own folders: only the registry (and each other's) import them.
MECHANISM_FOLDERS = ("dpicl.mechanisms.voting", "dpicl.mechanisms.esa", "dpicl.mechanisms.dps_mozo")

#: The transformers engine's helpers: they take a model runner, never the engine.
HELPERS = ("decoding", "generation", "past", "scoring")

#: The engines' folders (one per engine, and the process boundary): each imports the base
#: files of ``dpicl.engines`` and never another folder.
ENGINE_FOLDERS = ("transformers", "vllm", "oracle", "process")
#: The exceptions, each an engine-building edge: the factory selects an engine (and starts
#: the process); the engine process's entry builds through the factory and relays the
#: transformers engine's metrics and the oracle's detokeniser.
ENGINE_FOLDER_EDGES = {
    ("dpicl.engines.factory", "process"),
    ("dpicl.engines.factory", "transformers"),
    ("dpicl.engines.factory", "vllm"),
    ("dpicl.engines.factory", "oracle"),
    ("dpicl.engines.process.main", "dpicl.engines.factory"),
    ("dpicl.engines.process.main", "transformers"),
    ("dpicl.engines.process.main", "oracle"),
}


def _format(found: list[list[str]]) -> str:
    return "\n".join(" <-> ".join(component) for component in found)


def test_no_import_cycles() -> None:
    g = graph(PACKAGE)
    assert (
        len(g) > 50 and "dpicl.store.repository" in g and "dpicl.engines.transformers.runner" in g
    )
    found = cycles(g)
    assert found == [], f"import cycles in services/dpicl:\n{_format(found)}"


def _unit(module: str) -> tuple[int, str]:
    """(layer, the folder or top-level module of ``dpicl`` that ``module`` lies in)."""
    rel = module.removeprefix("dpicl").removeprefix(".") or "dpicl"
    top = rel.split(".")[0]
    for depth, names in enumerate(SERVER_LAYERS):
        if top in names:
            return depth, top
    raise AssertionError(f"module {module} is in no layer of SERVER_LAYERS")


def layer_violations(g: dict[str, set[str]]) -> list[str]:
    """Every import of a higher layer, or of another folder of the same layer."""
    out = []
    for a in sorted(g):
        la, pa = _unit(a)
        for b in sorted(g[a]):
            lb, pb = _unit(b)
            if lb > la or (lb == la and pa != pb):
                out.append(f"{a} -> {b}")
    return out


def is_route(module: str) -> bool:
    """A module of routes: ``api/routes/*.py``, the OpenAI surface's ``router.py``, a
    mechanism's ``routes.py``."""
    parts = module.split(".")
    return (
        (parts[:3] == ["dpicl", "api", "routes"] and len(parts) == 4)
        or module == "dpicl.api.openai.router"
        or (parts[:2] == ["dpicl", "mechanisms"] and parts[-1] == "routes")
    )


def _hands_on_routes(module: str) -> bool:
    """The modules that take routers to include them: the app, and a mechanism's
    ``mechanism.py`` (its ``routers()``, which the registry hands to the app)."""
    parts = module.split(".")
    return module == "dpicl.api.app" or (
        parts[:2] == ["dpicl", "mechanisms"] and parts[-1] == "mechanism"
    )


def route_violations(g: dict[str, set[str]]) -> list[str]:
    """Every import of a route module by anything but the app (or a mechanism's
    ``mechanism.py``): a route importing a sibling route, or a surface's service importing
    a route (issue 48: ``api/openai/serving.py`` and ``routes/debug.py`` took the outcomes
    from ``routes/inference.py``). What routes share lies below them, in ``serving/`` and
    ``web/``."""
    return [
        f"{a} -> {b}"
        for a in sorted(g)
        if not _hands_on_routes(a)
        for b in sorted(g[a])
        if is_route(b)
    ]


def arrows_back_up(g: dict[str, set[str]]) -> list[str]:
    """The arrows that run back up, counted file by file: against the layer order of the
    folders, and between routes."""
    return layer_violations(g) + route_violations(g)


def test_layers_run_one_way() -> None:
    g = graph(PACKAGE)
    # Every folder and top-level module of the package has its layer (no file is carved out).
    tops = {m.split(".")[1] for m in g if m != "dpicl"}
    assert tops <= {name for layer in SERVER_LAYERS for name in layer}
    assert all("." not in name for layer in SERVER_LAYERS for name in layer)
    assert sum(map(is_route, g)) >= 8  # the routes are found
    assert arrows_back_up(g) == []


@pytest.mark.parametrize(
    ("edge", "bad"),
    [
        # The three arrows that ran back up before issue 38.
        (("dpicl.pipelines.partitions", "dpicl.mechanisms.partitioning"), True),
        (("dpicl.pipelines.contexts", "dpicl.spec"), True),
        (("dpicl.privacy.mozo_proven", "dpicl.mechanisms.dps_mozo.proven"), True),
        (("dpicl.web.deps", "dpicl.mechanisms.registry"), True),
        (("dpicl.metrics", "dpicl.config"), True),
        # The arrows that ran back up before issue 48, counted file by file.
        (("dpicl.mechanisms.dps_mozo.routes", "dpicl.api.deps"), True),
        (("dpicl.mechanisms.dps_mozo.routes", "dpicl.api.schemas"), True),
        (("dpicl.api.openai.serving", "dpicl.api.routes.inference"), True),
        (("dpicl.api.openai.serving", "dpicl.api.routes.contexts"), True),
        (("dpicl.api.routes.debug", "dpicl.api.routes.inference"), True),
        (("dpicl.api.routes.debug", "dpicl.api.routes.queries"), True),
        (("dpicl.api.routes.zero_shot", "dpicl.api.routes.inference"), True),
        (("dpicl.serving.answers", "dpicl.api.deps"), True),
        # As they are now.
        (("dpicl.mechanisms.dps_mozo.routes", "dpicl.web.deps"), False),
        (("dpicl.mechanisms.dps_mozo.mechanism", "dpicl.mechanisms.dps_mozo.routes"), False),
        (("dpicl.serving.contexts", "dpicl.spec"), False),
        (("dpicl.api.openai.serving", "dpicl.serving.answers"), False),
        (("dpicl.api.routes.debug", "dpicl.serving.answers"), False),
        (("dpicl.api.app", "dpicl.api.routes.queries"), False),
    ],
)
def test_the_layer_check_can_fail(edge: tuple[str, str], bad: bool) -> None:
    a, b = edge
    assert bool(arrows_back_up({a: {b}, b: set()})) is bad


def test_only_the_registry_reaches_a_mechanisms_folder() -> None:
    # The routes, the OpenAI surface and context creation look a mechanism up by name
    # (issue 38: routes/contexts.py imported DPS-MOZO's synthesis).
    g = graph(PACKAGE)
    outside = sorted(
        f"{a} -> {b}"
        for a, targets in g.items()
        if not a.startswith("dpicl.mechanisms")
        for b in targets
        if b.startswith(MECHANISM_FOLDERS)
    )
    assert outside == []


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


def _engine_folder(module: str) -> str | None:
    """The engine folder ``module`` lies in, None for a base file of ``dpicl.engines``."""
    parts = module.split(".")
    if parts[:2] == ["dpicl", "engines"] and len(parts) >= 3 and parts[2] in ENGINE_FOLDERS:
        return parts[2]
    return None


def engine_violations(g: dict[str, set[str]]) -> list[str]:
    """Imports inside ``dpicl.engines`` that go up or sideways: a base file importing a
    folder, a folder importing another folder or the factory (beside ENGINE_FOLDER_EDGES)."""
    out = []
    for a in sorted(m for m in g if m.startswith("dpicl.engines.")):
        fa = _engine_folder(a)
        for b in sorted(t for t in g[a] if t.startswith("dpicl.engines.")):
            fb = _engine_folder(b)
            up = fb is not None and fb != fa
            factory = b == "dpicl.engines.factory"
            if (up or factory) and (a, fb or b) not in ENGINE_FOLDER_EDGES:
                out.append(f"{a} -> {b}")
    return out


def test_engines_are_folders_over_the_base_files() -> None:
    # Issue 48, item 6: one folder per engine; the base files (protocols, placement, tuning,
    # prompting, ...) import no folder, and no folder another.
    g = graph(PACKAGE)
    folders = {p.name for p in (PACKAGE / "engines").iterdir() if (p / "__init__.py").exists()}
    assert folders == set(ENGINE_FOLDERS)
    assert engine_violations(g) == []
    # The check can fail: a base file reaching up, one folder reaching into another.
    assert engine_violations(
        {
            "dpicl.engines.tuning": {"dpicl.engines.transformers.runner"},
            "dpicl.engines.vllm.engine": {"dpicl.engines.transformers.batching"},
            "dpicl.engines.oracle.engine": {"dpicl.engines.factory"},
        }
    ) == [
        "dpicl.engines.oracle.engine -> dpicl.engines.factory",
        "dpicl.engines.tuning -> dpicl.engines.transformers.runner",
        "dpicl.engines.vllm.engine -> dpicl.engines.transformers.batching",
    ]


def test_the_transformers_helpers_never_import_the_engine() -> None:
    g = graph(PACKAGE)
    for helper in HELPERS:
        imported = g[f"dpicl.engines.transformers.{helper}"]
        assert "dpicl.engines.transformers.engine" not in imported, helper
        if helper != "past":
            assert "dpicl.engines.transformers.runner" in imported, helper
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


def test_no_module_keeps_an_old_path_alive() -> None:
    # Issue 38, item 3: every import names the real module; an old path fails loudly.
    assert old_paths(PACKAGE) == [], "modules that alias an old path or only re-export"
    for old in ("dpicl.pipelines.voting", "dpicl.mechanisms.mozo", "dpicl.privacy.mozo_proven"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    # The check can fail: the shape the 8 shims had.
    assert aliases_itself(
        ast.parse("import sys\nimport m as _moved\nsys.modules[__name__] = _moved\n")
    )


#: The longest function the server may have (issue 38, item 6: one screen, with margin).
MAX_FUNCTION_LINES = 120


def test_no_function_is_longer_than_a_screen(tmp_path: Path) -> None:
    assert long_functions(PACKAGE, MAX_FUNCTION_LINES) == []
    # The check can fail.
    (tmp_path / "m.py").write_text("def f() -> None:\n" + "    pass\n" * MAX_FUNCTION_LINES)
    assert long_functions(tmp_path, MAX_FUNCTION_LINES) == ["m.py:1 f (121)"]


def _reads_the_record_by_key(tree: ast.Module) -> list[int]:
    """Lines of ``tree`` that read a stored mechanism record by key (``x.mechanism["k"]``,
    ``x.mechanism.get("k")``) instead of through the mechanism's typed calibration."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            target = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
        ):
            target = node.func.value
        else:
            continue
        if isinstance(target, ast.Attribute) and target.attr == "mechanism":
            out.append(node.lineno)
    return sorted(out)


def test_the_core_names_no_mechanism_and_reads_no_record_by_key() -> None:
    # Issue 38: outside mechanisms/, no line tests a mechanism's name, and every answer
    # reads its context's calibration (parsed once), not the stored record by string key.
    names = set(MECHANISMS) | {n.replace("-", "_") for n in MECHANISMS}
    named = {
        f: lines for f, tree in core_modules(PACKAGE) if (lines := names_a_mechanism(tree, names))
    }
    assert named == {}
    by_key = {
        f: lines
        for f, tree in core_modules(PACKAGE)
        if (lines := _reads_the_record_by_key(tree)) and f != "store/records.py"
    }
    assert by_key == {}
    # Both checks can fail: the shapes they had before issue 38.
    bad = ast.parse(
        'if ctx.mechanism.get("name") == "dps-mozo":\n    s = float(ctx.mechanism["sigma"])\n'
    )
    assert names_a_mechanism(bad, names) == [1]
    assert _reads_the_record_by_key(bad) == [1, 2]
